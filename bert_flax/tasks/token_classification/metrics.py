"""Entity-level precision, recall and F1 of tag sequences, decoded per label scheme as seqeval's
strict mode does (`seqeval.metrics.f1_score(..., mode="strict", scheme=IOB2)`) or as conlleval
does (seqeval's default mode), and conversion between schemes.

    entities(["B-PER", "I-PER", "O"], "IOB2")            # [("PER", 0, 2)]
    score(golds, predictions, "IOB2")["entity_f1"]       # micro-averaged over entity types
    score(golds, predictions, "IOB2", mode="conlleval")

Schemes: IOB1 (`I-` starts an entity; `B-` only one right after another of its type), IOB2
(every entity starts with `B-`), BIOES (`S-` a one-token entity, `B- I-* E-` a longer one), and
"none" (POS tags: no entities, only token accuracy). An entity counts only where the scheme's
rules start and end it; a prediction that breaks them (IOB2's `I-` after `O`) finds none there.
conlleval's mode reads every scheme alike and leniently: an entity starts at `B-` or `S-`, at
`I-` or `E-` after `O` or another type, and ends before a tag that cannot continue it (IOB2's
`I-PER` after `O` starts a PER). The two agree on sequences the scheme allows.
"""

from __future__ import annotations

from collections.abc import Sequence

SCHEMES = ("IOB1", "IOB2", "BIOES", "none")
MODES = ("strict", "conlleval")
OUTSIDE = "O"
_ANY = "IOBES"
# Per scheme: (prefix before, prefix now, type: "same" | "diff" | "any") patterns that start an
# entity at a tag, continue one, and end one before a tag (seqeval.scheme's tables).
_PATTERNS = {
    "IOB1": (
        {("O", "I", "any"), ("I", "I", "diff"), ("B", "I", "any"), ("I", "B", "same"),
         ("B", "B", "same")},
        {("B", "I", "same"), ("I", "I", "same")},
        {("I", "I", "diff"), ("I", "O", "any"), ("I", "B", "any"), ("B", "O", "any"),
         ("B", "I", "diff"), ("B", "B", "same")},
    ),
    "IOB2": (
        {(_ANY, "B", "any")},
        {("B", "I", "same"), ("I", "I", "same")},
        {("I", "O", "any"), ("I", "I", "diff"), ("I", "B", "any"), ("B", "O", "any"),
         ("B", "I", "diff"), ("B", "B", "any")},
    ),
    "BIOES": (
        {(_ANY, "B", "any"), (_ANY, "S", "any")},
        {("B", "I", "same"), ("B", "E", "same"), ("I", "I", "same"), ("I", "E", "same")},
        {("S", _ANY, "any"), ("E", _ANY, "any")},
    ),
}  # fmt: skip
PREFIXES = {"IOB1": "IB", "IOB2": "IB", "BIOES": "BIES"}
Entity = tuple[str, int, int]  # (type, first tag, one past the last)


def check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise ValueError(f"label scheme {scheme!r} is not one of {SCHEMES}.")


def check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"entity mode {mode!r} is not one of {MODES}.")


def tag_error(tag: str, scheme: str) -> str | None:
    """Why `tag` is not a tag of `scheme` (None if it is)."""
    if scheme == "none" or tag == OUTSIDE:
        return None
    prefix, dash, kind = tag.partition("-")
    if len(prefix) == 1 and dash and kind and prefix in PREFIXES[scheme]:
        return None
    allowed = ", ".join(f"{p}-TYPE" for p in PREFIXES[scheme])
    return f"label {tag!r} is not a {scheme} tag (O, {allowed})"


def _parse(tag: str) -> tuple[str, str]:
    return (OUTSIDE, "_") if tag == OUTSIDE else (tag[0], tag[2:])


def _matches(patterns: set, before: tuple[str, str], now: tuple[str, str]) -> bool:
    same = before[1] == now[1]
    return any(
        before[0] in b and now[0] in n and (t == "any" or same == (t == "same"))
        for b, n, t in patterns
    )


def entities(tags: Sequence[str], scheme: str, mode: str = "strict") -> list[Entity]:
    """The entities of one sentence's tags under `scheme` (none for "none"), read as `mode`
    does."""
    check_scheme(scheme)
    check_mode(mode)
    if scheme == "none":
        return []
    return _strict(tags, scheme) if mode == "strict" else _conlleval(tags)


def _strict(tags: Sequence[str], scheme: str) -> list[Entity]:
    start, inside, end = _PATTERNS[scheme]
    parsed = [_parse(t) for t in tags] + [(OUTSIDE, "_")]
    found: list[Entity] = []
    i, before = 0, parsed[-1]
    while i < len(parsed):
        if _matches(start, before, parsed[i]):
            j = i + 1
            while _matches(inside, parsed[j - 1], parsed[j]):
                j += 1
            if _matches(end, parsed[j - 1], parsed[j]):
                found.append((parsed[i][1], i, j))
            i = j
        else:
            i += 1
        before = parsed[i - 1]
    return found


def _conlleval(tags: Sequence[str]) -> list[Entity]:
    """conlleval's chunks (seqeval's `get_entities`)."""
    found: list[Entity] = []
    first, before, before_kind = 0, OUTSIDE, ""
    for i, tag in enumerate([*tags, OUTSIDE]):
        prefix, kind = tag[0], tag[1:].split("-", 1)[-1] or "_"
        other = before_kind != kind
        if before in "ES" or (before in "BI" and prefix in "BS") or (before != "O" and other):
            found.append((before_kind, first, i))
        if prefix in "BS" or (before in "ESO" and prefix in "EI") or (prefix != "O" and other):
            first = i
        before, before_kind = prefix, kind
    return found


def to_tags(found: Sequence[Entity], length: int, scheme: str) -> list[str]:
    """`length` tags that encode the entities `found` (not overlapping) under `scheme`."""
    tags = [OUTSIDE] * length
    last_end, last_kind = -1, None
    for kind, first, end in sorted(found, key=lambda e: e[1]):
        if scheme == "BIOES":
            inner = ["S"] if end - first == 1 else ["B", *"I" * (end - first - 2), "E"]
        elif scheme == "IOB2":
            inner = ["B", *"I" * (end - first - 1)]
        else:  # IOB1: B only where it follows an entity of its type
            head = "B" if (last_end, last_kind) == (first, kind) else "I"
            inner = [head, *"I" * (end - first - 1)]
        tags[first:end] = [f"{p}-{kind}" for p in inner]
        last_end, last_kind = end, kind
    return tags


def convert(tags: Sequence[str], source: str, target: str) -> list[str]:
    """`tags` of scheme `source` in scheme `target` (entities the source scheme does not
    recognise become O)."""
    if source == target:
        return list(tags)
    if "none" in (source, target):
        raise ValueError(f"Cannot convert tags between {source!r} and {target!r}.")
    return to_tags(entities(tags, source), len(tags), target)


def _prf(hits: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = hits / predicted if predicted else 0.0
    recall = hits / gold if gold else 0.0
    total = precision + recall
    return precision, recall, (2 * precision * recall / total if total else 0.0)


def score(
    golds: Sequence[Sequence[str]],
    predictions: Sequence[Sequence[str]],
    scheme: str,
    mode: str = "strict",
) -> dict[str, float]:
    """Token accuracy, and (unless scheme "none") entity precision, recall and F1, micro-averaged
    (`entity_*`) and per type (`TYPE_precision`, `TYPE_recall`, `TYPE_f1`): fractions, as
    seqeval reports them in `mode`."""
    if len(golds) != len(predictions) or any(len(g) != len(p) for g, p in zip(golds, predictions)):
        raise ValueError("Gold and predicted sentences differ in number or length.")
    flat_gold = [t for s in golds for t in s]
    hits = sum(g == p for g, p in zip(flat_gold, (t for s in predictions for t in s)))
    result = {"token_accuracy": hits / max(1, len(flat_gold))}
    if scheme == "none":
        return result
    gold = {(i, *e) for i, s in enumerate(golds) for e in entities(s, scheme, mode)}
    found = {(i, *e) for i, s in enumerate(predictions) for e in entities(s, scheme, mode)}
    for kind in sorted({e[1] for e in gold | found}):
        of_kind = [{e for e in s if e[1] == kind} for s in (gold, found)]
        figures = _prf(len(of_kind[0] & of_kind[1]), len(of_kind[1]), len(of_kind[0]))
        result.update(zip((f"{kind}_{m}" for m in ("precision", "recall", "f1")), figures))
    figures = _prf(len(gold & found), len(found), len(gold))
    result.update(zip(("entity_precision", "entity_recall", "entity_f1"), figures))
    return result
