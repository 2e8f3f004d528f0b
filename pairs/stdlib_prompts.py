"""More training instructions for the real pair's drafts, written from the one-line docstrings of
the Python standard library's public functions and methods: "Return the number of ..." becomes
"Write a Python function that returns the number of ...", and one in three of them "Explain what
module.name in Python's standard library does and when you would use it." The hand-written
instructions come first, then the derived ones, none equal to an evaluation prompt.

    python -m pairs.stdlib_prompts --out workloads/train_instructions_wide.jsonl

The output depends on the Python it runs on (its standard library's docstrings); the file in
workloads/ is what the builds read, and workloads/README.md names the Python that wrote it.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import re
import sys
import sysconfig
from pathlib import Path

from pairs import chat_data, smollm2

SKIPPED_PACKAGES = {
    "test",
    "tests",
    "idlelib",
    "lib2to3",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "site-packages",
    "encodings",
    "distutils",
    "pydoc_data",
    "__phello__",
}
VERBS = {
    "Return",
    "Returns",
    "Get",
    "Parse",
    "Convert",
    "Encode",
    "Decode",
    "Create",
    "Find",
    "Read",
    "Copy",
    "Write",
    "Format",
    "Generate",
    "Extract",
    "Split",
    "Remove",
    "Compute",
    "Calculate",
    "Check",
    "Make",
    "Build",
    "Join",
    "Normalize",
    "Strip",
    "Count",
    "Compare",
    "Escape",
    "Unescape",
    "Quote",
    "Test",
    "Add",
    "Open",
    "Wrap",
    "Guess",
    "Set",
    "Clear",
    "Print",
    "Translate",
    "Replace",
    "Sort",
    "Search",
}


def docstring_lines(stdlib: Path) -> list[tuple[str, str, str]]:
    """(module, qualified name, first docstring sentence) of public functions and methods."""
    found = []
    for path in sorted(stdlib.rglob("*.py")):
        parts = path.relative_to(stdlib).with_suffix("").parts
        if any(p.startswith("_") or p in SKIPPED_PACKAGES for p in parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        module = ".".join(parts)
        for node in tree.body:
            for qualname, function in _public_functions(node):
                line = _first_sentence(ast.get_docstring(function) or "")
                if line:
                    found.append((module, qualname, line))
    return found


def _public_functions(node):
    if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
        yield node.name, node
    elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and not item.name.startswith("_"):
                yield f"{node.name}.{item.name}", item


def _first_sentence(doc: str) -> str | None:
    line = " ".join(doc.strip().split("\n\n")[0].split())
    if not 25 <= len(line) <= 120 or not line.endswith(".") or line.count(".") > 1:
        return None
    if not re.match(r"^[A-Z][a-z]+ [a-z]", line) or line.split()[0] not in VERBS:
        return None
    return line.replace("*", "").replace("`", "'")


def third_person(verb: str) -> str:
    """Return -> returns, Copy -> copies, Search -> searches; Returns stays."""
    verb = verb.lower()
    if verb.endswith(("sh", "ch", "x", "ss")):
        return verb + "es"
    if verb.endswith("s"):
        return verb
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"


def instruction(module: str, qualname: str, line: str) -> str:
    """An explanation for one in three functions (by a hash of the name), a task for the rest."""
    if int(hashlib.sha256(f"{module}.{qualname}".encode()).hexdigest(), 16) % 3 == 0:
        return f"Explain what {module}.{qualname} in Python's standard library does and when you would use it."
    verb, rest = line.split(" ", 1)
    return f"Write a Python function that {third_person(verb)} {rest}"


def derived_prompts(stdlib: Path, exclude: set[str]) -> list[str]:
    seen, prompts = set(exclude), []
    for module, qualname, line in docstring_lines(stdlib):
        prompt = instruction(module, qualname, line)
        key = " ".join(prompt.lower().split())
        if key not in seen:
            seen.add(key)
            prompts.append(prompt)
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    args = parser.parse_args(argv)
    written = chat_data.read_prompts(smollm2.TRAIN_PROMPTS)
    exclude = {" ".join(p.lower().split()) for p in written + chat_data.read_prompts(smollm2.EVAL_PROMPTS)}
    derived = derived_prompts(args.stdlib, exclude)
    args.out.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in written + derived))
    smollm2.check_prompts_apart(args.out, smollm2.EVAL_PROMPTS)
    print(f"written={len(written)} derived={len(derived)} python={sys.version.split()[0]} out={args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
