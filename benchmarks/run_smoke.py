"""Run every benchmark script once with --quick (tox -e bench-smoke); fails if any script fails."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON files")
    args = p.parse_args()
    scripts = sorted(s for s in HERE.glob("*.py") if not s.name.startswith("_") and s.name != "run_smoke.py")
    failed = []
    for script in scripts:
        out = args.out / f"{script.stem}.json"
        print(f"== {script.name} --quick", flush=True)
        rc = subprocess.run(
            [sys.executable, str(script), "--quick", "--out", str(out)], check=False, timeout=900
        ).returncode
        if rc != 0 or not out.exists():
            failed.append(script.name)
    print(f"{len(scripts) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
