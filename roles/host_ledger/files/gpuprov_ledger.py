#!/usr/bin/env python3
"""The host's ledger of what gpuprov's stages changed, so that `gpuprov reset` can take exactly that back.

Kept on the host (it is the host's history, whoever runs gpuprov next), under one directory:

- baseline.json: the host as the first stage found it (installed packages, holds, the watched files and
  directories). Reset's round-trip proof compares against it.
- stages/<stage>.json: per stage, the packages and holds its runs added, and per watched file the content
  it had before the stage first touched it (a copy under originals/<stage>/, with its checksum; or that
  it did not exist).
- shas.json: per file, every checksum gpuprov's runs left it with. A file whose checksum is none of these
  (nor its original) was changed by someone else since: reset reports it and leaves it.
- runs/<stage>.json: the host at the start of a run that has not ended (a run that failed half-way leaves
  it, so the next run's additions are counted from the earlier start).

Commands (one JSON document on stdout each): start, end, plan, forget, proof, state. `start`/`end`
bracket a stage's run; `plan` says what a reset of the stage would do; `forget` drops the stage's ledger
once reset took it back; `proof` compares the host with the baseline. Only `start`, `end` and `forget`
write, and only under the ledger directory. Runs on the target's own Python 3 (3.8 or newer).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from typing import Any

STAGE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
MAX_FILES = 4000  # per watched directory: beyond that the directory is tracked by existence only
MAX_KEEP = 4 * 1024 * 1024  # a larger file is tracked by checksum, not kept
APT_DPKG_ENV = {"LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}


def die(msg: str) -> None:
    sys.stderr.write(f"gpuprov-ledger: {msg}\n")
    sys.exit(2)


def clean_path(p: str) -> str:
    if not p.startswith("/") or "\x00" in p or p != os.path.normpath(p) or p == "/":
        die(f"not an absolute, normal path: {p!r}")
    return p


def sha256(path: str) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()
    except OSError:
        return None


def run(argv: list[str]) -> str:
    env = dict(os.environ, **APT_DPKG_ENV)
    return subprocess.run(argv, capture_output=True, text=True, check=False, env=env).stdout


def packages() -> dict[str, str]:
    """Installed packages (name:arch as dpkg names them) and their versions."""
    out = run(["dpkg-query", "-W", "-f", "${binary:Package}\t${Version}\t${db:Status-Abbrev}\n"])
    found = {}
    for line in out.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[2][1:2] == "i":
            found[parts[0]] = parts[1]
    return found


def holds() -> list[str]:
    out = run(["dpkg", "--get-selections"])
    return sorted(line.split()[0] for line in out.splitlines() if line.split()[1:2] == ["hold"])


def files_under(path: str) -> dict[str, str | None]:
    """The regular files at or under `path` (not following links out of it) and their checksums."""
    if os.path.isfile(path) and not os.path.islink(path):
        return {path: sha256(path)}
    found: dict[str, str | None] = {}
    if not os.path.isdir(path) or os.path.islink(path):
        return found
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            full = os.path.join(root, name)
            if os.path.isfile(full) and not os.path.islink(full):
                found[full] = sha256(full)
                if len(found) >= MAX_FILES:
                    return found
    return found


def dirs_under(path: str) -> list[str]:
    """The directories under `path` (not `path` itself, not following links)."""
    found: list[str] = []
    if not os.path.isdir(path) or os.path.islink(path):
        return found
    for root, dirs, _names in os.walk(path):
        dirs.sort()
        found.extend(os.path.join(root, d) for d in dirs if not os.path.islink(os.path.join(root, d)))
        if len(found) >= MAX_FILES:
            break
    return found


def snapshot(paths: list[str]) -> dict[str, Any]:
    files: dict[str, str | None] = {}
    dirs: list[str] = []
    for p in paths:
        files.update(files_under(p))
        dirs.extend(dirs_under(p))
    return {
        "packages": packages(),
        "holds": holds(),
        "files": files,
        "dirs": sorted(set(dirs)),
        "exists": {p: os.path.lexists(p) for p in paths},
    }


class Ledger:
    def __init__(self, root: str) -> None:
        self.root = clean_path(root)

    def _p(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def read(self, *parts: str) -> Any:
        try:
            with open(self._p(*parts)) as f:
                return json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            die(f"{self._p(*parts)}: unreadable ledger file: {exc}")

    def write(self, doc: Any, *parts: str) -> None:
        path = self._p(*parts)
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)

    def remove(self, *parts: str) -> None:
        path = self._p(*parts)
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def stages(self) -> list[str]:
        try:
            return sorted(n[:-5] for n in os.listdir(self._p("stages")) if n.endswith(".json"))
        except FileNotFoundError:
            return []


def keep_name(path: str) -> str:
    return hashlib.sha256(path.encode()).hexdigest()[:32]


def cmd_start(led: Ledger, stage: str, paths: list[str], state_dirs: list[str]) -> dict[str, Any]:
    watched = paths + state_dirs
    snap = snapshot(paths)
    snap["exists"].update({d: os.path.lexists(d) for d in state_dirs})
    base = led.read("baseline.json")
    if base is None:
        # Whether the ledger's own parent (/var/lib/gpuprov) was there: if not, it goes with the ledger.
        parent = os.path.dirname(led.root)
        base = dict(snap, at=time.time(), state_dirs=[], parent_existed=os.path.isdir(parent))
    # A path first watched by a later stage: its state when first seen is the state before gpuprov
    # touched it (an earlier stage that changes it watches it too, and saw it first).
    base.setdefault("dirs", [])
    for p in watched:
        if p not in base["exists"]:
            base["exists"][p] = snap["exists"].get(p, False)
            for f, s in snap["files"].items():
                if f == p or f.startswith(p + "/"):
                    base["files"].setdefault(f, s)
            base["dirs"] = sorted(set(base["dirs"]) | {d for d in snap["dirs"] if d.startswith(p + "/")})
    base["state_dirs"] = sorted(set(base["state_dirs"]) | set(state_dirs))
    led.write(base, "baseline.json")

    doc = led.read("stages", f"{stage}.json")
    first = doc is None
    if first:
        doc = {"stage": stage, "first_run": time.time(), "added_packages": [], "added_holds": [], "files": {}}
    doc["paths"] = sorted(set(doc.get("paths", [])) | set(paths))
    doc["state_dirs"] = sorted(set(doc.get("state_dirs", [])) | set(state_dirs))
    doc.setdefault("exists", {})
    doc.setdefault("dirs_before", [])
    for p in watched:
        if p not in doc["exists"]:
            doc["exists"][p] = snap["exists"].get(p, False)
            doc["dirs_before"] = sorted(
                set(doc["dirs_before"]) | {d for d in snap["dirs"] if d.startswith(p + "/")}
            )
    for f, s in snap["files"].items():
        if f in doc["files"]:
            continue
        entry: dict[str, Any] = {"original": s, "first_run": first}
        st = os.stat(f)
        entry.update(mode=st.st_mode & 0o7777, uid=st.st_uid, gid=st.st_gid)
        if s is not None and st.st_size <= MAX_KEEP:
            dest = led._p("originals", stage, keep_name(f))
            os.makedirs(os.path.dirname(dest), mode=0o700, exist_ok=True)
            shutil.copyfile(f, dest)
            entry["kept"] = dest
        doc["files"][f] = entry
    led.write(doc, "stages", f"{stage}.json")
    if led.read("runs", f"{stage}.json") is None:
        led.write(snap, "runs", f"{stage}.json")
    return {"stage": stage, "first": first}


def cmd_end(led: Ledger, stage: str) -> dict[str, Any]:
    doc = led.read("stages", f"{stage}.json")
    began = led.read("runs", f"{stage}.json")
    if doc is None or began is None:
        die(f"{stage}: no run of the stage was started")
    snap = snapshot(doc["paths"])
    added = sorted(set(snap["packages"]) - set(began["packages"]))
    doc["added_packages"] = sorted(set(doc["added_packages"]) | set(added))
    doc["added_holds"] = sorted(set(doc["added_holds"]) | (set(snap["holds"]) - set(began["holds"])))
    for f in snap["files"]:
        # A file that appeared during the run: it did not exist before the stage.
        doc["files"].setdefault(f, {"original": None})
    shas = led.read("shas.json") or {}
    for f, s in snap["files"].items():
        if s is not None and s not in shas.setdefault(f, []):
            shas[f].append(s)
    led.write(shas, "shas.json")
    led.write(doc, "stages", f"{stage}.json")
    led.remove("runs", f"{stage}.json")
    return {"stage": stage, "added_packages": added}


def _collateral(names: list[str]) -> list[str]:
    """What apt would remove besides `names` when purging them (a package someone else installed that
    depends on them)."""
    if not names:
        return []
    out = run(["apt-get", "-s", "-o", "Debug::NoLocking=1", "purge", *names])
    gone = {line.split()[1] for line in out.splitlines() if line.startswith(("Purg ", "Remv "))}
    bare = {n.split(":")[0] for n in names}
    return sorted(g for g in gone if g.split(":")[0] not in bare)


def _restoring(path: str, entry: dict[str, Any]) -> dict[str, Any]:
    """A plan's item for a file to put back: its kept copy and the mode and owner it had."""
    return {
        "path": path,
        "kept": entry["kept"],
        "mode": f"{entry['mode']:04o}",
        "uid": entry["uid"],
        "gid": entry["gid"],
    }


def cmd_plan(led: Ledger, stage: str, later: list[str]) -> dict[str, Any]:
    doc = led.read("stages", f"{stage}.json")
    plan: dict[str, Any] = {
        "stage": stage,
        "recorded": doc is not None,
        "packages": [],
        "collateral": [],
        "holds": [],
        "restore": [],
        "remove": [],
        "foreign": [],
        "dirs": [],
        "wipe": [],
        "existed": {},
        "blocked_by": [s for s in led.stages() if s in later],
    }
    if doc is None:
        return plan
    installed = packages()
    plan["packages"] = [p for p in doc["added_packages"] if p in installed]
    plan["collateral"] = _collateral(plan["packages"])
    held = set(holds())
    plan["holds"] = [h for h in doc["added_holds"] if h in held]
    shas = led.read("shas.json") or {}
    now = {}
    for p in doc["paths"]:
        now.update(files_under(p))
    for f, entry in sorted(doc["files"].items()):
        cur = now.get(f) if f in now else (sha256(f) if os.path.isfile(f) else None)
        original = entry.get("original")
        if cur == original or (cur is None and original is None):
            continue
        if cur is None:
            # There before the stage and gone now. One the stage's first run found is the host's own
            # (a purged package took it as its conffile): back it comes. One first seen on a later run
            # was written by a later stage in between and went with that stage's reset: not this one's.
            if not entry.get("first_run"):
                continue
            if entry.get("kept"):
                plan["restore"].append(_restoring(f, entry))
            else:
                plan["foreign"].append({"path": f, "why": "gone, and its original was too large to keep"})
            continue
        if cur not in shas.get(f, []):
            plan["foreign"].append({"path": f, "why": "changed by someone else since gpuprov wrote it"})
        elif original is None:
            plan["remove"].append(f)
        elif entry.get("kept"):
            plan["restore"].append(_restoring(f, entry))
        else:
            plan["foreign"].append({"path": f, "why": "its original was too large to keep"})
    # Files that appeared in a watched directory after the stage ran, written by nobody gpuprov knows.
    for f in sorted(set(now) - set(doc["files"])):
        if now[f] not in shas.get(f, []):
            plan["foreign"].append({"path": f, "why": "not gpuprov's: appeared after the stage ran"})
    exists = doc.get("exists", {})
    plan["existed"] = exists
    # The directories the stage made, deepest first: watched paths that were not there, and directories
    # that appeared under a watched path (removed by reset only when empty: someone else's files stay).
    before = set(doc.get("dirs_before", []))
    made = {p for p in doc["paths"] if not exists.get(p) and os.path.isdir(p)}
    for p in doc["paths"]:
        made |= {d for d in dirs_under(p) if d not in before}
    plan["dirs"] = sorted(made, key=lambda d: (-d.count("/"), d))
    plan["wipe"] = [d for d in doc["state_dirs"] if not exists.get(d) and os.path.lexists(d)]
    return plan


def cmd_forget(led: Ledger, stage: str) -> dict[str, Any]:
    had = led.read("stages", f"{stage}.json") is not None
    led.remove("stages", f"{stage}.json")
    led.remove("runs", f"{stage}.json")
    led.remove("originals", stage)
    return {"stage": stage, "forgot": had, "left": led.stages()}


def cmd_proof(led: Ledger, drop: bool) -> dict[str, Any]:
    """The host against the baseline: packages, holds, and every watched path. With `drop`, a clean
    host whose stages are all taken back loses the ledger too (nothing of gpuprov's is left)."""
    base = led.read("baseline.json")
    if base is None:
        return {"recorded": False, "clean": None, "differences": [], "stages": []}
    diffs: list[str] = []
    pk = packages()
    for p in sorted(set(pk) - set(base["packages"])):
        diffs.append(f"package {p} installed since")
    for p in sorted(set(base["packages"]) - set(pk)):
        diffs.append(f"package {p} removed since")
    now_holds = set(holds())
    for h in sorted(now_holds ^ set(base["holds"])):
        diffs.append(f"hold on {h} " + ("added" if h in now_holds else "removed"))
    for p, existed in sorted(base["exists"].items()):
        if p in base["state_dirs"]:  # data: only whether it is there
            if os.path.lexists(p) != existed:
                diffs.append(f"{p} " + ("exists; it did not before" if not existed else "missing"))
            continue
        now_files = files_under(p)
        if not existed:
            if os.path.lexists(p):
                diffs.append(f"{p} exists ({len(now_files)} file(s)); it did not before")
            continue
        then_dirs = {d for d in base.get("dirs", []) if d.startswith(p + "/")}
        for d in sorted(set(dirs_under(p)) ^ then_dirs):
            diffs.append(f"{d}/ " + ("added" if d not in then_dirs else "missing"))
        then = {f: s for f, s in base["files"].items() if f == p or f.startswith(p.rstrip("/") + "/")}
        for f in sorted(set(now_files) | set(then)):
            if f not in now_files:
                diffs.append(f"{f} missing")
            elif f not in then:
                diffs.append(f"{f} added")
            elif now_files[f] != then[f]:
                diffs.append(f"{f} differs")
    left = led.stages()
    clean = not diffs
    if drop and clean and not left:
        shutil.rmtree(led.root)
        parent = os.path.dirname(led.root)
        if base.get("parent_existed") is False and not os.listdir(parent):
            os.rmdir(parent)
    return {"recorded": True, "clean": clean, "differences": diffs[:200], "stages": left}


def main() -> None:
    ap = argparse.ArgumentParser(prog="gpuprov-ledger")
    ap.add_argument("--dir", default="/var/lib/gpuprov/ledger")
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start")
    s.add_argument("stage")
    s.add_argument("--path", action="append", default=[])
    s.add_argument("--state-dir", action="append", default=[])
    for name in ("end", "forget"):
        sub.add_parser(name).add_argument("stage")
    pl = sub.add_parser("plan")
    pl.add_argument("stage")
    pl.add_argument("--later", action="append", default=[])
    sub.add_parser("proof").add_argument("--drop", action="store_true")
    sub.add_parser("state").add_argument("--path", action="append", default=[])
    a = ap.parse_args()
    led = Ledger(a.dir)
    if getattr(a, "stage", None) is not None and not STAGE.match(a.stage):
        die(f"not a stage name: {a.stage!r}")
    if a.cmd == "start":
        out = cmd_start(led, a.stage, [clean_path(p) for p in a.path], [clean_path(p) for p in a.state_dir])
    elif a.cmd == "end":
        out = cmd_end(led, a.stage)
    elif a.cmd == "plan":
        out = cmd_plan(led, a.stage, a.later)
    elif a.cmd == "forget":
        out = cmd_forget(led, a.stage)
    elif a.cmd == "proof":
        out = cmd_proof(led, a.drop)
    else:
        out = snapshot([clean_path(p) for p in a.path])
    json.dump(out, sys.stdout, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
