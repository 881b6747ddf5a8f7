"""An HTML template for `dvc plots show --html-template` whose Vega, Vega-Lite and vega-embed come from a package
installed in .venv (vl-convert-python's bundle), not from a CDN: the page renders with no network.

DVC fills a template by plain string replacement: `{plot_divs}` (required) gets one `<div>` per plot, each calling
`vegaEmbed('#id', spec)`; `{scripts}` would get DVC's three `<script src="https://cdn.jsdelivr.net/...">` tags, so
this template has no `{scripts}` and inlines the bundle instead (`make plots`)."""
from __future__ import annotations

import re
from pathlib import Path

PLACEHOLDERS = ("{plot_divs}", "{scripts}", "{refresh_tag}")

# The bundle's default snippet sets window.vega and window.vegaLite from default imports the libraries do not have
# (null); DVC's divs need only vegaEmbed, which carries its own Vega and Vega-Lite.
SNIPPET = "window.vegaEmbed = vegaEmbed;"

PAGE = """<!DOCTYPE html>
<html>
<head>
    <meta charset="utf-8">
    {refresh_tag}
    <title>DVC plots (offline)</title>
    <!-- {versions}: inlined from vl-convert-python {vlc} (ragteam plots-template), no CDN -->
    <script type="text/javascript">
(function () {
__BUNDLE__
})();
    </script>
    <style>
        table {
            border-spacing: 15px;
        }
    </style>
</head>
<body>
    {plot_divs}
</body>
</html>
"""


def vega_lite_version(available: list[str], schema_major: str = "5") -> str:
    """The newest Vega-Lite of `available` ("5.21", "6.4", ...) with DVC's schema major version: DVC's plot
    templates declare vega-lite/v5.json."""
    same = [v for v in available if v.split(".")[0] == schema_major]
    if not same:
        raise ValueError(f"vl-convert ships no Vega-Lite {schema_major}.x (it has {', '.join(available)})")
    return max(same, key=lambda v: tuple(int(p) for p in v.split(".")))


def render_template(bundle: str, versions: str, vlc_version: str) -> str:
    """The page around `bundle`: a classic script (DVC's divs call vegaEmbed synchronously as the page parses), its
    top-level names kept out of the page's globals by a function scope."""
    if "</script" in bundle.lower():
        bundle = re.sub(r"</(script)", r"<\\/\1", bundle, flags=re.I)
    clash = [p for p in PLACEHOLDERS if p in bundle]
    if clash:
        raise ValueError(f"the JavaScript bundle contains DVC's placeholder(s) {clash}: DVC would replace them")
    page = PAGE.replace("{versions}", versions).replace("{vlc}", vlc_version)
    return page.replace("__BUNDLE__", bundle)


def write_template(out: Path) -> str:
    """Write the offline template to `out`; return what it inlines (one line)."""
    import vl_convert

    vl = vega_lite_version(vl_convert.get_vegalite_versions())
    versions = (f"Vega {vl_convert.get_vega_version()}, Vega-Lite {vl}, "
                f"vega-embed {vl_convert.get_vega_embed_version()}")
    page = render_template(vl_convert.javascript_bundle(SNIPPET, vl_version=vl), versions, vl_convert.__version__)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return f"{out}: {versions} inlined ({len(page) // 1024} KiB), no network"


SCRIPT_TAG = re.compile(r"<script\b([^>]*)>", re.I)


def network_scripts(html: str) -> list[str]:
    """The `<script>` tags of a page that load from the network (src=http(s)://... or protocol-relative //...)."""
    return [m.group(0) for m in SCRIPT_TAG.finditer(html)
            if re.search(r"""\bsrc\s*=\s*["']?\s*(?:https?:)?//""", m.group(1), re.I)]
