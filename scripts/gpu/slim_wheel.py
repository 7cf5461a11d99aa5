"""Write a smaller copy of a wheel without the parts a GPU check does not use.

Ray's wheel for CPython 3.12 (manylinux x86_64) is 76 MiB, over the 64 MiB that can be
carried to the GPU machine in one call; 31 MiB of it is the Java worker (``ray/jars``) and
2.5 MiB the dashboard's web front end (``ray/dashboard/client``), neither of which a Python
cluster started with ``ray start --include-dashboard false`` touches. The copy drops the
named folders and their lines of ``RECORD``, so pip installs it as usual.

    python3 scripts/gpu/slim_wheel.py .whl/ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl
    python3 scripts/gpu/slim_wheel.py WHEEL --drop ray/jars/ --drop ray/dashboard/client/ --out DIR

The slim wheel replaces the original (or goes to ``--out``) and keeps its file name.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import zipfile
from pathlib import Path

DEFAULT_DROP = ("ray/jars/", "ray/dashboard/client/")


def slim(wheel: Path, drop: tuple[str, ...], out_dir: Path | None = None) -> Path:
    out_dir = out_dir or wheel.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, suffix=".whl.part")
    os.close(fd)
    kept = dropped = 0
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        for info in src.infolist():
            name = info.filename
            if any(name.startswith(d) for d in drop):
                dropped += info.file_size
                continue
            data = src.read(info)
            if name.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(x for x in lines if not any(x.startswith(d) for d in drop)) + "\n").encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
            kept += 1
    target = out_dir / wheel.name
    os.chmod(tmp, 0o644)
    os.replace(tmp, target)
    print(f"{target}: {kept} files kept, {dropped / 2**20:.1f} MiB (uncompressed) left out")
    return target


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--drop", action="append", help="path prefix to leave out (repeatable; default: Ray's Java and web parts)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the slim wheel (default: replace the original)")
    args = ap.parse_args()
    before = args.wheel.stat().st_size
    target = slim(args.wheel, tuple(args.drop or DEFAULT_DROP), args.out)
    print(f"size {before / 2**20:.1f} MiB -> {target.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
