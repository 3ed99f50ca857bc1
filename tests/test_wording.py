"""The user-facing text speaks of the product, its users and its numbers, never of how or when
the project was made: README.md, docs/*.md, benchmarks/README.md, and every comment, docstring
and message in shardkit/. And docs/index.md lists each page once.

The patterns name the project's own history ("session 8", "this session's changes", "issue 28's
target", "this round", "turn 3", "the review found"); a user's words that look alike stay
allowed ("a session token", ``DaskSession``, "per round", "round trip")."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HISTORY = re.compile(
    r"\bsessions? \d+"                                      # "session 8", "sessions 7 and 8"
    r"|\b(?:this|that|last|previous|earlier|next) sessions?\b"  # "rerun this session"
    r"|\bissues? #?\d+"                                     # "issue 28's target"
    r"|\b(?:this|last|previous|earlier|next) rounds?\b"     # "this round"
    r"|\bturns? \d+\b"                                      # "turn 3"
    r"|\b(?:the|an|outside|code) review\b"                  # "the review found"
    r"|\breview(?:er)?s? (?:found|said|asked|noted)\b"
    r"|\b(?:last|previous|this) landing\b",                 # "the last landing's CI"
    re.IGNORECASE)


def _texts() -> list[str]:
    """Every file whose words users read: relative paths."""
    out = ["README.md", os.path.join("benchmarks", "README.md")]
    out += sorted(os.path.join("docs", n) for n in os.listdir(os.path.join(ROOT, "docs"))
                  if n.endswith(".md"))
    for folder, _, files in os.walk(os.path.join(ROOT, "shardkit")):
        out += sorted(os.path.relpath(os.path.join(folder, n), ROOT) for n in files
                      if n.endswith(".py"))
    return out


def history_words(text: str) -> list[str]:
    """Each line that speaks of how the project was made (the line, stripped)."""
    return [line.strip() for line in text.splitlines() if HISTORY.search(line)]


def test_no_words_about_how_the_project_was_made():
    found = {}
    for rel in _texts():
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            lines = history_words(f.read())
        if lines:
            found[rel] = lines
    assert found == {}


def test_the_pattern_catches_history_and_spares_the_products_words():
    for bad in ("none was this session.", "Since then (sessions 7 and 8) the suite",
                "rerun after this session's changes", "Both meet issue 28's target",
                "fixed in this round", "as of turn 12", "the review found a leak",
                "an outside review measured it", "Issue #37 asked for it",
                "The last landing's CI took 2,542 s"):
        assert history_words(bad) == [bad], bad
    for fine in ("refresh the session token (AWS_SESSION_TOKEN)", "with DaskSession(None, 1)",
                 "if run.session is not None:", "a round trip to every worker",
                 "per round: tiny 0.95-0.99", "--rounds 7", "medians of 3 alternating rounds",
                 "Python's round: an excess of 3", "a training session of 90 epochs",
                 "returns the next batch in turn", "issues a GET per shard"):
        assert history_words(fine) == [], fine


def test_the_docs_index_lists_each_page_once():
    with open(os.path.join(ROOT, "docs", "index.md"), encoding="utf-8") as f:
        rows = [line for line in f if line.startswith("| [")]
    listed = [re.match(r"\| \[[^\]]+\]\(([^)#]+)\)", row).group(1) for row in rows]
    pages = sorted(n for n in os.listdir(os.path.join(ROOT, "docs"))
                   if n.endswith(".md") and n != "index.md")
    assert sorted(listed) == pages  # each page once: no page twice, none missing
