import json

import pytest

from pairs import build, chat_data, smollm2, smollm2_eagle, stdlib_prompts

WIDE = smollm2.WIDE_TRAIN_PROMPTS

MODULE = '''
def count_vowels(text):
    """Return the number of vowels in text."""

def copy_tree(src, dst):
    """Copy every file under src to dst."""

def _private(x):
    """Return a private thing that nobody should see."""

def too_short():
    """Return x."""

def two_sentences():
    """Return the first line. Then do something else entirely."""

def not_a_verb():
    """Helper for the module below, kept for compatibility."""

class Matcher:
    def search(self, pattern):
        """Search the text for the first match of pattern."""

    def _hidden(self):
        """Return something that is not part of the public surface."""
'''


@pytest.fixture
def fake_stdlib(tmp_path):
    (tmp_path / "textkit.py").write_text(MODULE)
    (tmp_path / "_internal.py").write_text(MODULE)
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "test_textkit.py").write_text(MODULE)
    (tmp_path / "broken.py").write_text("def (:\n")
    return tmp_path


def test_only_public_one_sentence_verb_docstrings_of_public_modules_are_read(fake_stdlib):
    assert stdlib_prompts.docstring_lines(fake_stdlib) == [
        ("textkit", "count_vowels", "Return the number of vowels in text."),
        ("textkit", "copy_tree", "Copy every file under src to dst."),
        ("textkit", "Matcher.search", "Search the text for the first match of pattern."),
    ]


@pytest.mark.parametrize(
    "verb, expected",
    [
        ("Return", "returns"),
        ("Returns", "returns"),
        ("Copy", "copies"),
        ("Search", "searches"),
        ("Parse", "parses"),
        ("Get", "gets"),
        ("Add", "adds"),
        ("Compress", "compresses"),
    ],
)
def test_verbs_take_the_third_person(verb, expected):
    assert stdlib_prompts.third_person(verb) == expected


def test_a_docstring_becomes_a_task_or_an_explanation(fake_stdlib):
    prompts = stdlib_prompts.derived_prompts(fake_stdlib, exclude=set())
    assert len(prompts) == 3
    for prompt, (module, name, line) in zip(prompts, stdlib_prompts.docstring_lines(fake_stdlib)):
        assert prompt in (
            f"Write a Python function that {stdlib_prompts.third_person(line.split()[0])} {line.split(' ', 1)[1]}",
            f"Explain what {module}.{name} in Python's standard library does and when you would use it.",
        )


def test_excluded_and_repeated_prompts_are_dropped(fake_stdlib):
    first = stdlib_prompts.derived_prompts(fake_stdlib, exclude=set())[0]
    assert first not in stdlib_prompts.derived_prompts(fake_stdlib, exclude={" ".join(first.lower().split())})
    (fake_stdlib / "textkit2.py").write_text(
        'def count_vowels(text):\n    """Return the number of vowels in text."""\n'
    )
    prompts = stdlib_prompts.derived_prompts(fake_stdlib, exclude=set())
    assert len(prompts) == len(set(prompts))


def test_the_written_file_keeps_the_hand_written_prompts_first_and_none_of_the_evaluation_set(fake_stdlib, tmp_path):
    out = tmp_path / "wide.jsonl"
    assert stdlib_prompts.main(["--out", str(out), "--stdlib", str(fake_stdlib)]) == 0
    written = chat_data.read_prompts(smollm2.TRAIN_PROMPTS)
    prompts = chat_data.read_prompts(out)
    assert prompts[: len(written)] == written and len(prompts) == len(written) + 3
    smollm2.check_prompts_apart(out, smollm2.EVAL_PROMPTS)


def test_the_shipped_wide_prompts_extend_the_hand_written_ones_apart_from_the_evaluation_set():
    written = chat_data.read_prompts(smollm2.TRAIN_PROMPTS)
    wide = chat_data.read_prompts(WIDE)
    assert wide[: len(written)] == written and len(wide) >= 2 * len(written) - 100
    assert len({" ".join(p.lower().split()) for p in wide}) == len(wide)
    smollm2.check_prompts_apart(WIDE, smollm2.EVAL_PROMPTS)
    assert all(json.loads(line)["prompt"] for line in WIDE.read_text().splitlines())


def test_the_build_takes_the_prompts_file_and_answers_per_prompt(tmp_path):
    config = build.parse_args(
        ["--out", str(tmp_path), "--family", "smollm2-eagle", "--prompts", str(WIDE), "--samples-per-prompt", "1"]
    )
    assert config == smollm2_eagle.EaglePairConfig(out_dir=tmp_path, prompts_path=WIDE, samples_per_prompt=1)
    with pytest.raises(SystemExit):
        build.parse_args(["--out", str(tmp_path), "--prompts", str(WIDE)])  # stdlib-gpt2 reads no prompts
