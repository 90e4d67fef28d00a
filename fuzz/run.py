"""Build the collector's C extension with sanitizers and fuzz it: ``python fuzz/run.py``.

The extension is compiled again by gcc, with AddressSanitizer and
UndefinedBehaviorSanitizer (any report aborts the run), into ``.cache/fuzz/`` (rebuilt
when ``_native.c`` changes); ``fuzz/collector_target.py`` runs under libFuzzer
(atheris) with atheris's sanitizer runtime preloaded. ``--runs N`` or ``--seconds S``
bound the run. The corpus is ``fuzz/corpus/``, which a long run (``make fuzz``)
grows in place; ``--scratch`` works on a copy of it instead (what ``make test``
does). The last line says how many inputs ran and how many findings there were;
the exit status is non-zero on any finding.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src" / "spanmill" / "_native.c"
CORPUS = ROOT / "fuzz" / "corpus"
TARGET = ROOT / "fuzz" / "collector_target.py"
SANITIZERS = "-fsanitize=address,undefined"


def _runtime() -> Path:
    """atheris's AddressSanitizer runtime with libFuzzer and UBSan's handlers in it."""
    import atheris

    found = Path(atheris.__file__).parents[1] / "asan_with_fuzzer.so"
    if not found.is_file():
        raise SystemExit(f"atheris has no {found.name}")
    return found


def build(cache: Path) -> Path:
    """The sanitized extension, built once per version of its source.

    Compiled with gcc's instrumentation but linked without its runtime: the runtime
    preloaded at run time (atheris's, with libFuzzer in it) must be the only one.
    """
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = cache / digest / f"_native{sysconfig.get_config_var('EXT_SUFFIX')}"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    objects = out.with_suffix(".o")
    flags = [SANITIZERS, "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g",
             "-O1", "-fPIC", f"-I{sysconfig.get_paths()['include']}"]  # fmt: skip
    subprocess.run(["gcc", *flags, "-c", str(SOURCE), "-o", str(objects)], check=True)
    subprocess.run(["gcc", "-shared", str(objects), "-o", str(out)], check=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    bound = parser.add_mutually_exclusive_group(required=True)
    bound.add_argument("--runs", type=int, help="Inputs to execute.")
    bound.add_argument("--seconds", type=int, help="Time to fuzz for.")
    parser.add_argument("--scratch", action="store_true", help="Leave fuzz/corpus as it is.")
    parser.add_argument("--cache", type=Path, default=ROOT / ".cache" / "fuzz")
    args = parser.parse_args(argv)

    extension = build(args.cache)
    with tempfile.TemporaryDirectory(prefix="spanmill-fuzz-") as scratch:
        corpus = CORPUS
        if args.scratch:
            corpus = Path(scratch) / "corpus"
            shutil.copytree(CORPUS, corpus)
        limit = f"-runs={args.runs}" if args.runs is not None else f"-max_total_time={args.seconds}"
        env = {
            **os.environ,
            "SPANMILL_FUZZ_NATIVE": str(extension),
            "LD_PRELOAD": str(_runtime()),
            # Python's own allocations at exit are not the extension's leaks.
            "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:allocator_may_return_null=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            "PYTHONMALLOC": "malloc",  # every allocation through ASan's allocator
        }
        command = [sys.executable, str(TARGET), limit, "-max_len=65536", "-timeout=30",
                   f"-artifact_prefix={Path(scratch)}/", str(corpus)]  # fmt: skip
        # In the scratch folder: libFuzzer writes a Python exception's input to the working
        # directory whatever -artifact_prefix says.
        result = subprocess.run(command, env=env, capture_output=True, text=True, cwd=scratch)
    output = result.stdout + result.stderr
    done = re.search(r"Done (\d+) runs in (\d+) second", output)
    findings = len(re.findall(r"ERROR: AddressSanitizer|runtime error:|Uncaught Python exception",
                              output))  # fmt: skip
    if result.returncode != 0 or done is None:
        print(output[-6000:], file=sys.stderr)
        findings = max(findings, 1)
    runs = int(done.group(1)) if done else 0
    seconds = int(done.group(2)) if done else 0
    checks = "AddressSanitizer, UndefinedBehaviorSanitizer, native path == authority and steps"
    print(f"fuzz: {runs} inputs executed in {seconds} s, {findings} findings ({checks})")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
