"""Training prompts across the chat mix's nine categories, from two processes independent of the
evaluation mix (workloads/README.md):

- written: the seeds of pairs.chat_seeds (forms, topics, situations, sentences, word problems) and
  pairs.chat_openers (conversation openers), combined and sampled with a fixed seed;
- derived: passages and sentences of the Python standard library's documentation that ship with
  the interpreter (pydoc_data.topics, the language reference's topics; module docstrings), turned
  into summarizing, extraction, translation, explanation, conversation and coding instructions.

Exact and near-duplicates are dropped (smollm2.near_duplicates), and the result must stay apart
from both evaluation sets (smollm2.check_apart_from_evaluation) or nothing is written.

    python -m pairs.chat_train_prompts --out workloads/train_chat.jsonl
"""

from __future__ import annotations

import argparse
import ast
import pydoc_data.topics
import random
import re
import sys
import sysconfig
from collections import Counter
from pathlib import Path

from pairs import chat_openers
from pairs import chat_seeds as seeds
from pairs import smollm2, stdlib_prompts
from pairs.chat_data import PromptItem, write_items

WRITTEN = "written for this project from pairs.chat_seeds (dated in workloads/README.md)"
TOPICS = "derived from pydoc_data.topics of CPython {v} (Python documentation, PSF License Agreement)"
DOCSTRINGS = "derived from docstrings of CPython {v}'s standard library (PSF License Agreement)"
SEED = 61


def written_items(rng: random.Random) -> list[PromptItem]:
    items = []
    items += _combos(rng, "writing", seeds.WRITING_FORMS, seeds.WRITING_TOPICS, 300)
    items += _combos(rng, "advice", seeds.ADVICE_FORMS, seeds.ADVICE_TOPICS, 280)
    items += _combos(rng, "explanation", seeds.EXPLANATION_FORMS, seeds.EXPLANATION_TOPICS, 300)
    coding = [form.format(lang=lang, t="{t}") for form in seeds.CODING_FORMS for lang in seeds.CODING_LANGUAGES]
    items += _combos(rng, "coding", coding, seeds.CODING_TASKS, 240)
    items += [PromptItem(q, category="coding", source=WRITTEN) for q in seeds.CODING_QUESTIONS]
    items += [
        PromptItem(_math_problem(rng, template), category="math", source=WRITTEN)
        for template in seeds.MATH_TEMPLATES
        for _ in range(14)
    ]
    items += [
        PromptItem(
            rng.choice(seeds.TRANSLATION_FORMS).format(lang=rng.choice(seeds.TRANSLATION_LANGUAGES), t=sentence),
            category="translation",
            source=WRITTEN,
        )
        for sentence in seeds.TRANSLATION_SENTENCES
    ]
    items += [
        PromptItem(follow_up, ((("user", q), ("assistant", a))), "conversation", WRITTEN)
        for q, a in chat_openers.CONVERSATION_OPENERS
        for follow_up in rng.sample(chat_openers.CONVERSATION_FOLLOW_UPS, 2)
    ]
    items += [PromptItem(_note(rng), category="extraction", source=WRITTEN) for _ in range(80)]
    return items


def _combos(rng: random.Random, category: str, forms, topics, count: int) -> list[PromptItem]:
    pairs = [(form, topic) for form in forms for topic in topics]
    return [
        PromptItem(form.format(t=topic), category=category, source=WRITTEN)
        for form, topic in rng.sample(pairs, min(count, len(pairs)))
    ]


def _math_problem(rng: random.Random, template: str) -> str:
    a, b = rng.randint(2, 40), rng.randint(2, 40)
    name, name2 = rng.sample(seeds.NAMES, 2)
    values = dict(
        name=name,
        name2=name2,
        a=a,
        b=b,
        c=a * rng.randint(2, 9) + b,
        d=rng.randint(2, 90),
        p=rng.randint(2, 12),
        h=rng.randint(2, 9),
        h2=rng.randint(1, 5),
        s=rng.randint(2, 6),
        s2=rng.randint(3, 12),
        n=rng.randint(50, 999),
        pct=rng.choice([5, 10, 15, 20, 25, 30, 40]),
        odd=2 * rng.randint(10, 300) + 1,
        p0=rng.randint(20, 200),
        a2=a * 6,
        b2=b * 6,
    )
    values["p1"] = values["p0"] + rng.randint(1, 60)
    values["note"] = (a * values["p"] // 50 + 1) * 50  # enough to pay for the notebooks
    values["ages"] = 2 * rng.randint(3, 60) + a + 2 * values["h"]  # whole ages for both
    return template.format(**values)


NOTE_EVENTS = (
    "team lunch",
    "parents' evening",
    "book club",
    "football practice",
    "dentist appointment",
    "yoga class",
    "quarterly review",
    "choir rehearsal",
    "flat viewing",
    "birthday party",
)
NOTE_PLACES = (
    "the café on Mill Street",
    "room 4B",
    "the community hall",
    "Platform 2",
    "the north car park",
    "Dr Patel's surgery",
    "the park gates",
    "our office on the third floor",
)
NOTE_ASKS = (
    "Extract the event, day, time and place as a JSON object.",
    "Pull out every date, time and place from this message.",
    "From this message, list who is involved and what they need to bring.",
    "Extract the key details (what, when, where) as a bulleted list.",
)


def _note(rng: random.Random) -> str:
    who, other = rng.sample(seeds.NAMES, 2)
    day = rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"))
    hour = f"{rng.randint(7, 20)}:{rng.choice(('00', '15', '30', '45'))}"
    extra = rng.choice(
        (
            "Bring a water bottle.",
            f"{other} will bring the slides.",
            "Parking is free after six.",
            "Please reply by Wednesday.",
            f"Call {other} on 0161 {rng.randint(100, 999)} {rng.randint(1000, 9999)} if you are late.",
            f"It costs {rng.randint(3, 30)} pounds per person.",
        )
    )
    note = (
        f"Hi {who}, the {rng.choice(NOTE_EVENTS)} is now on {day} at {hour} at {rng.choice(NOTE_PLACES)}. "
        f"{extra} Thanks, {other}"
    )
    return f"{rng.choice(NOTE_ASKS)}\n\n{note}"


SUMMARIZE_ASKS = (
    "Summarize the following passage in two sentences.",
    "Give a one-sentence summary of this text.",
    "Summarize this paragraph as three short bullet points.",
    "What is the main point of the passage below? Answer briefly.",
    "Rewrite this passage as a short summary a beginner could follow.",
)
EXTRACT_ASKS = (
    "List every technical term this passage uses, separated by commas.",
    "Extract the rules this passage states, as a numbered list.",
    "Which Python names (keywords, functions, attributes) does this passage mention? List them.",
    "Pull out any exception names, numbers or default values the passage mentions, or say there are none.",
    "From the passage below, extract each condition and what happens when it holds.",
)
TRANSLATE_ASK = "Translate this sentence from the Python documentation into {lang}: {t}"


def documentation_items(rng: random.Random, stdlib: Path) -> list[PromptItem]:
    version = sys.version.split()[0]
    topics, docstrings = TOPICS.format(v=version), DOCSTRINGS.format(v=version)
    passages = [(p, topics) for p in _paragraphs(pydoc_data.topics.topics.values())]
    passages += [(p, docstrings) for p in _paragraphs(_module_docstrings(stdlib).values())]
    rng.shuffle(passages)
    cut = len(passages) * 3 // 5  # extraction has the written notes besides
    items = [
        PromptItem(f"{rng.choice(SUMMARIZE_ASKS)}\n\n{p}", category="summarization", source=s)
        for p, s in passages[:cut]
    ]
    items += [
        PromptItem(f"{rng.choice(EXTRACT_ASKS)}\n\n{p}", category="extraction", source=s) for p, s in passages[cut:]
    ]
    sentences = _sentences(pydoc_data.topics.topics.values())
    items += [
        PromptItem(
            TRANSLATE_ASK.format(lang=rng.choice(seeds.TRANSLATION_LANGUAGES), t=t),
            category="translation",
            source=topics,
        )
        for t in rng.sample(sentences, min(110, len(sentences)))
    ]
    modules = _module_docstrings(stdlib)
    for name in rng.sample(sorted(modules), min(90, len(modules))):
        first = _first_sentences(modules[name])
        if first:
            items.append(
                PromptItem(
                    rng.choice(chat_openers.CONVERSATION_FOLLOW_UPS),
                    (("user", f"What is the {name} module in Python for?"), ("assistant", first)),
                    "conversation",
                    docstrings,
                )
            )
    described = [(name, _first_sentences(modules[name])) for name in sorted(modules)]
    items += [
        PromptItem(
            f'Python\'s documentation describes the {name} module as: "{first}" '
            "Explain what that means in plain words, and when you would reach for it.",
            category="explanation",
            source=docstrings,
        )
        for name, first in [d for d in described if d[1]]
    ]
    lines = stdlib_prompts.docstring_lines(stdlib)
    for module, qualname, line in rng.sample(lines, 80):
        verb, rest = line.split(" ", 1)
        lang = rng.choice([lang for lang in seeds.CODING_LANGUAGES if lang != "Python"])
        items.append(
            PromptItem(
                f"Write a {lang} function that {stdlib_prompts.third_person(verb)} {rest}",
                category="coding",
                source=docstrings,
            )
        )
    return items


def _paragraphs(texts) -> list[str]:
    """Prose paragraphs of 40-140 words: no grammar rules, doctest sessions or indented code."""
    found = []
    for text in texts:
        for paragraph in re.split(r"\n\s*\n", text):
            if re.search(r"::=|>>>|^\s{3,}\S", paragraph, re.MULTILINE):
                continue
            words = " ".join(paragraph.split())
            if 40 <= len(words.split()) <= 140 and words[0].isupper():
                found.append(words)
    return sorted(set(found))


def _sentences(texts) -> list[str]:
    found = set()
    for text in texts:
        for sentence in re.split(r"(?<=\.)\s+", " ".join(text.split())):
            if (
                10 <= len(sentence.split()) <= 28
                and re.match(r"^[A-Z][a-z]", sentence)
                and not re.search(r"[=(){}\[\]\"*]", sentence)
            ):
                found.add(sentence)
    return sorted(found)


def _first_sentences(doc: str) -> str | None:
    text = " ".join(doc.split("\n\n")[0].split())
    return text if 8 <= len(text.split()) <= 60 and text.endswith(".") else None


def _module_docstrings(stdlib: Path) -> dict[str, str]:
    found = {}
    for path in sorted(stdlib.glob("*.py")):
        if path.stem.startswith("_") or path.stem in stdlib_prompts.SKIPPED_PACKAGES:
            continue
        try:
            doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
        except (SyntaxError, UnicodeDecodeError):
            continue
        if doc and len(doc.split()) >= 8:
            found[path.stem] = doc
    return found


def without_duplicates(items: list[PromptItem]) -> list[PromptItem]:
    """The first of every group of exact or near-duplicates (their whole text, turns included)."""
    dropped = {j for _, j in smollm2.near_duplicates([item.text() for item in items])}
    return [item for i, item in enumerate(items) if i not in dropped]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--stdlib", type=Path, default=Path(sysconfig.get_paths()["stdlib"]))
    args = parser.parse_args(argv)
    rng = random.Random(SEED)
    items = without_duplicates(written_items(rng) + documentation_items(rng, args.stdlib))
    partial = args.out.with_suffix(".partial")
    write_items(items, partial)
    smollm2.check_apart_from_evaluation(partial)
    partial.rename(args.out)
    counts = Counter(item.category for item in items)
    print(
        f"items={len(items)} "
        + " ".join(f"{c}={n}" for c, n in sorted(counts.items()))
        + f" written={sum(i.source == WRITTEN for i in items)} python={sys.version.split()[0]} out={args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
