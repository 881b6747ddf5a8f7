"""A team's shared DVC remote on S3 (dvc-s3) round-trips data and stage outputs between clones, against moto's server: a
local S3-compatible endpoint, fake credentials, no network. The remote is configured with README's three lines."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import boto3
import pytest

BIN = Path(sys.executable).parent
DVC = shutil.which("dvc", path=BIN)
BUCKET = "ragteam-team"
KEY, SECRET = "testing-key", "testing-secret"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def s3_endpoint(tmp_path):
    """moto's server on a free localhost port, with an empty bucket; stopped at teardown."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = (tmp_path / "moto.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, f"moto server exited: {(tmp_path / 'moto.log').read_text()}"
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=1)
                break
            except OSError:
                assert time.monotonic() < deadline, "moto server did not answer within 20 s"
                time.sleep(0.1)
        boto3.client("s3", endpoint_url=url, region_name="us-east-1", aws_access_key_id=KEY,
                     aws_secret_access_key=SECRET).create_bucket(Bucket=BUCKET)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


STAGE_YAML = """\
stages:
  make:
    cmd: >-
      {python} -c "import pathlib, json;
      [pathlib.Path(d).mkdir(parents=True, exist_ok=True) for d in ('out/index', 'out/shards', 'metrics')];
      pathlib.Path('out/index/i.txt').write_text(str(len(open('data/x.txt').read()) + 1) + chr(10));
      pathlib.Path('out/shards/0.txt').write_text('s' + chr(10));
      json.dump(dict(rows=1), open('metrics/make.json', 'w'));
      open('{log}', 'a').write('make' + chr(10))"
    deps: [data]
    outs:
      - out/index
      - out/shards:
          persist: true
      - metrics/make.json:
          cache: false
"""


def run(args, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


def test_push_to_s3_from_one_clone_and_pull_into_a_fresh_one(tmp_path, s3_endpoint):
    assert DVC, f"no dvc next to {sys.executable}"
    # no AWS settings from this machine: clone a gets its credentials from .dvc/config.local, clone b from the env
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    base |= {"DVC_NO_ANALYTICS": "1", "AWS_CONFIG_FILE": str(tmp_path / "none"),
             "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true"}
    env_b = base | {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_DEFAULT_REGION": "us-east-1"}

    a = tmp_path / "a"
    a.mkdir()
    for args in (["git", "init", "-q", "-b", "main"], ["git", "config", "user.email", "t@example.com"],
                 ["git", "config", "user.name", "t"], [DVC, "init", "-q"],
                 # README's three lines
                 [DVC, "remote", "add", "-d", "team", f"s3://{BUCKET}/ragteam"],
                 [DVC, "remote", "modify", "team", "endpointurl", s3_endpoint],
                 [DVC, "remote", "modify", "--local", "team", "access_key_id", KEY],
                 [DVC, "remote", "modify", "--local", "team", "secret_access_key", SECRET]):
        run(args, a, base)
    (a / "data").mkdir()
    (a / "data/x.txt").write_text("x\n")
    (a / "data/y.jsonl").write_text('{"q": "y"}\n')
    run([DVC, "add", "data"], a, base)
    # a stage's outputs too, as the pipeline's are: a cached directory, a persistent one (index_dense's shards) and
    # an uncached record that git holds; each run appends to a log outside the checkouts
    (a / "dvc.yaml").write_text(STAGE_YAML.format(python=sys.executable, log=tmp_path / "runs.log"))
    run([DVC, "repro"], a, base)
    run([DVC, "push"], a, base)
    run(["git", "add", "-A"], a, base)
    run(["git", "commit", "-q", "-m", "data"], a, base)
    assert ".dvc/config.local" not in run(["git", "ls-files"], a, base)      # the keys stay out of git
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1", aws_access_key_id=KEY,
                      aws_secret_access_key=SECRET)
    stored = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", [])]
    # data: 2 files + the dir; the stage: out/index (1 file + the dir), out/shards (1 file + the dir)
    assert len(stored) == 7 and all(k.startswith("ragteam/files/md5/") for k in stored)

    b = tmp_path / "b"
    run(["git", "clone", "-q", str(a), str(b)], tmp_path, base)
    assert not (b / "data").exists()
    run([DVC, "pull"], b, env_b)                                 # the remote comes with the clone's .dvc/config
    assert (b / "data/x.txt").read_text() == "x\n"
    assert (b / "data/y.jsonl").read_text() == '{"q": "y"}\n'
    assert (b / "out/index/i.txt").read_text() == "3\n" and (b / "out/shards/0.txt").read_text() == "s\n"
    assert "up to date" in run([DVC, "status"], b, env_b).lower()
    assert "in sync" in run([DVC, "status", "--cloud"], b, env_b).lower()
    run([DVC, "repro"], b, env_b)                                # nothing to recompute in the pulled clone
    assert (tmp_path / "runs.log").read_text() == "make\n"
