"""Study code (seed replicates, joint and team studies) kept out of the `ragteam` library: `python -m studies`."""
