"""A stand-in for ``adb`` whose device is this host: ``shell`` runs ``sh -c`` on the joined
arguments (as adb does), ``push``/``pull`` copy files. Every call is logged (one JSON line)
to the file named by ``$FAKE_ADB_LOG``; a serial other than ``$FAKE_ADB_SERIAL`` fails. A pull
of a file named ``$FAKE_ADB_CUT`` loses its last byte (a transfer cut short)."""

import json
import os
import shutil
import subprocess
import sys


def main(argv):
    log = os.environ.get("FAKE_ADB_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(json.dumps(argv) + "\n")
    serial = None
    if argv[:1] == ["-s"]:
        serial, argv = argv[1], argv[2:]
    expected = os.environ.get("FAKE_ADB_SERIAL")
    if expected and serial != expected:
        sys.stderr.write(f"adb: device '{serial}' not found\n")
        return 1
    if not argv:
        return 1
    cmd, rest = argv[0], argv[1:]
    if cmd == "shell":
        return subprocess.call(["sh", "-c", " ".join(rest)])
    if cmd == "push":
        shutil.copyfile(rest[0], rest[1])
        print(f"{rest[0]}: 1 file pushed")
        return 0
    if cmd == "pull":
        if not os.path.isfile(rest[0]):
            sys.stderr.write(f"adb: error: failed to stat remote object '{rest[0]}'\n")
            return 1
        shutil.copyfile(rest[0], rest[1])
        if os.path.basename(rest[0]) == os.environ.get("FAKE_ADB_CUT"):
            with open(rest[1], "rb+") as fh:
                fh.truncate(max(0, os.path.getsize(rest[1]) - 1))
        return 0
    sys.stderr.write(f"adb: unknown command {cmd}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
