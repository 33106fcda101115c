"""How synthetic Glaive records draw argument values: the pools' train, holdout and synthetic parts.

The function schemas and the value pools themselves are a data table, catalogue_data.py; their row
types are catalogue_types.py. Both are importable from here as before.

Value pools and held-out values
-------------------------------
Every open-ended argument value (a city, an amount, a date, an item of an array) comes from a named pool:
an ordered sequence of values. Value `i` of a pool belongs to the **holdout** part when
`i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1` (a quarter of every pool), otherwise to the **train** part. The
partition depends on the pool alone, never on the seed, so data synthesised with `values="train"` and data
synthesised with `values="holdout"` (any seeds) share no open-ended value: an evaluation on the holdout
data measures whether a model copies arguments from the request instead of recalling them.
Enum values and booleans are closed sets fixed by the schema: they are drawn from all of their values.

A third part, **synthetic**, teaches copying: for pretraining the bundled tiny model, and as the CPU
demo's fine-tuning data (configs/finetune/tiny-cpu.yaml). A listed text value becomes a made-up one of the
same shape (half: letter runs replaced by random letters and digits by random digits, case and
punctuation kept: "ORD" -> "KWT", "Cape Town" -> "Rilo Vadf"; half: a near miss of a train value with one
or two characters changed, "potatoes" -> "potatxes"); half the numbers are made up (1144.5 -> 7302.8),
the others and dates come from the train part; never is one a holdout value. With a dozen cities per
pool, recalling a value is easier than copying it from the request; made-up values can only be copied,
which is the skill the holdout evaluation asks for (and the holdout part's numbers would otherwise differ
from every train number in a learnable way: the price pool's holdout part is every x.5 of an even x).
Given word pieces (`MadeUp(pieces)`: the tiny tokenizer's alphabetic tokens), half of the made-up text
values are built from them instead ("Cape Town" -> "Brokern Tealing", now and then with an accented
letter, an initial or a possessive): a held-out word is written with tokens that no train value leaves
whole ("broccoli" -> bro|cc|ol|i), and a model copies only the tokens whose embeddings it has trained.
"""

from __future__ import annotations

import functools
import random
import re
import string
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gpuval.finetune.data.catalogue_data import ALIASES, BY_NAME, CATALOGUE, POOLS
from gpuval.finetune.data.catalogue_types import FunctionSpec, Param, Pool

__all__ = [
    "ACCENTED",
    "ALIASES",
    "BY_NAME",
    "CATALOGUE",
    "HOLDOUT_EVERY",
    "POOLS",
    "FunctionSpec",
    "MadeUp",
    "Param",
    "Pool",
    "ValuePart",
    "Values",
    "alternatives",
    "draw",
    "made_up_like",
    "near_miss",
    "number_like",
    "pieces_like",
    "pool_part",
]

ValuePart = Literal["train", "holdout", "all", "synthetic"]


@dataclass(frozen=True)
class MadeUp:
    """The "synthetic" part with word pieces to build made-up values from (see the module's docstring)."""

    pieces: tuple[str, ...]


Values = ValuePart | MadeUp
HOLDOUT_EVERY = 4


def _part_size(pool: Pool, part: ValuePart) -> int:
    held = pool.size // HOLDOUT_EVERY
    return {"train": pool.size - held, "holdout": held, "all": pool.size, "synthetic": pool.size - held}[part]


def _part_index(j: int, part: ValuePart) -> int:
    """The pool index of the j-th value of `part`."""
    if part == "holdout":
        return j * HOLDOUT_EVERY + HOLDOUT_EVERY - 1
    if part == "train":
        return (j // (HOLDOUT_EVERY - 1)) * HOLDOUT_EVERY + j % (HOLDOUT_EVERY - 1)
    return j


def pool_part(pool_name: str, part: ValuePart) -> list[Any]:
    """Every value of one part of a pool, in pool order (for tests and for documentation)."""
    pool = POOLS[pool_name]
    return [pool.value(_part_index(j, part)) for j in range(_part_size(pool, part))]


def alternatives(value: Any) -> tuple[str, ...]:
    """Other spellings that name what the listed text value `value` names, for a reference's acceptable
    answers (synth's OpenAI output): its ALIASES, then each of those and the value itself without accents
    ("Kraków" -> "Krakow"), none twice and never the value itself. A made-up value (the synthetic part)
    names nothing else, and a number, boolean or list has no other spelling: none for them."""
    if not isinstance(value, str) or value not in _listed_texts():
        return ()
    found: list[str] = []
    for spelling in (value, *ALIASES.get(value, ())):
        for candidate in (spelling, _unaccented(spelling)):
            if candidate != value and candidate not in found:
                found.append(candidate)
    return tuple(found)


@functools.cache
def _listed_texts() -> frozenset[str]:
    return frozenset(pool.value(i) for pool in POOLS.values() if pool.text for i in range(pool.size))


def _unaccented(text: str) -> str:
    """`text` with its accents removed: decomposed (NFKD) and the combining marks dropped."""
    return "".join(c for c in unicodedata.normalize("NFKD", text) if not unicodedata.combining(c))


def made_up_like(example: str, rng: random.Random) -> str:
    """`example` with every run of letters replaced by random letters of the same length and case, and
    every digit by a random digit ("1Z02694242" -> "1Z57130968"): no part of a train value survives to
    be recalled instead of copied. Now and then a URL gains a query, another value an accented letter."""

    def letters(match: re.Match[str]) -> str:
        run = match.group(0)
        out = "".join(rng.choice(string.ascii_lowercase) for _ in run)
        if run.isupper():
            return out.upper()
        return out.capitalize() if run[0].isupper() else out

    made = re.sub(r"[^\W\d_]+", letters, example)
    made = re.sub(r"\d", lambda _match: rng.choice(string.digits), made)
    # Shapes the train values lack but a request may hold: a URL's query ("?item=42"), a letter with an
    # accent ("Kraków"); rare, so that most values keep their example's shape.
    if "://" in made and "?" not in made and rng.random() < 0.25:
        key = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 6)))
        made += f"?{key}={rng.randint(1, 999)}"
    elif not re.search(r"[/@]", made) and rng.random() < 0.1:
        spots = [i for i, c in enumerate(made) if "a" <= c <= "z"]
        if spots:
            at = rng.choice(spots)
            made = made[:at] + rng.choice(ACCENTED) + made[at + 1 :]
    return made


def near_miss(example: str, rng: random.Random) -> str:
    """`example` with one letter or digit changed (two in values longer than six characters), case kept:
    "potatoes" -> "potatxes". The held-out values the tiny model fails to copy share pieces with values it
    knows ("potaexa" for "potatoes"); a near miss can only be reproduced by copying, not by recall."""
    chars = list(example)
    spots = [i for i, c in enumerate(chars) if c.isalnum()]
    if not spots:
        return example
    for i in rng.sample(spots, min(len(spots), 2 if len(example) > 6 else 1)):
        c = chars[i]
        pool = string.digits if c.isdigit() else string.ascii_lowercase
        new = rng.choice(pool.replace(c.lower(), ""))
        chars[i] = new.upper() if c.isupper() else new
    return "".join(chars)


# Punctuation inside held-out values ("St. John's", "Ursula K. Le Guin") that a pool's train part may lack;
# a full stop only after an initial, never last: a value that may run on after ". " teaches a model to copy
# the request's full stop ("Germany."). No comma: a list's items are written "a, b and c" in requests.
INNER_MARKS = ("'s ", "'", "-")
# Letters of held-out names ("Kraków") that no train value has: their UTF-8 bytes are tokens of their own.
ACCENTED = "áàâäãåçéèêëíìîïñóòôöõøúùûüýś"
REPEATED_WORD_PROBABILITY = 0.1  # each word of a made-up value after its first
POSSESSIVE_END_PROBABILITY = 0.05


def pieces_like(example: str, rng: random.Random, pieces: Sequence[str]) -> str:
    """`example` with every run of letters replaced by random word `pieces` joined to about the run's
    length, case kept, now and then with an accented letter or a word of the value said again
    ("github.com/pytorch/pytorch", "Walla Walla"); sometimes a word more, an initial ("K. ") or a mark from
    INNER_MARKS inside, or an abbreviation before a name ("Mt. "): how many words a value has, and where
    it ends, must be read from the request too."""

    address = "/" in example or "@" in example  # keeps its shape, and ASCII
    said: list[str] = []

    def word(length: int) -> str:
        out = rng.choice(pieces)
        while len(out) < length:
            out += rng.choice(pieces)
        if not address and rng.random() < 0.1:
            at = rng.randrange(len(out))
            out = out[:at] + rng.choice(ACCENTED) + out[at + 1 :]
        return out

    def letters(match: re.Match[str]) -> str:
        run = match.group(0)
        # A word said twice: a copy that follows the first occurrence runs on from there instead.
        if said and rng.random() < REPEATED_WORD_PROBABILITY:
            out = rng.choice(said)
        else:
            out = word(len(run)).lower()
            said.append(out)
        if run.isupper():
            return out.upper()
        return out.capitalize() if run[0].isupper() else out

    made = re.sub(r"[^\W\d_]+", letters, example)
    if address:
        return made
    if rng.random() < 0.25:
        made += rng.choice((" ", *INNER_MARKS)) + word(rng.randint(2, 8))
    if " " in made and rng.random() < 0.25:
        at = rng.choice([i for i, c in enumerate(made) if c == " "])
        mark = rng.choice((*INNER_MARKS, f" {rng.choice(string.ascii_uppercase)}. "))
        made = made[:at] + mark + made[at + 1 :]
    if example[0].isupper() and not example.isupper() and rng.random() < 0.1:
        made = f"{_abbreviation(rng)}. {made}"  # "St. John's": a full stop that does not end the value
    if rng.random() < POSSESSIVE_END_PROBABILITY and made[-1].isalpha():
        made += "'s"  # the marks above are always followed by a word; here one ends the value ("Macy's")
    return made


def _abbreviation(rng: random.Random) -> str:
    return rng.choice(string.ascii_uppercase) + "".join(
        rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 2))
    )


def number_like(example: int | float, rng: random.Random) -> int | float:
    """A number of `example`'s shape with random digits (the first never 0; 1144.5 -> 7302.8): numbers can
    be copied, not recalled, and the decimal digit is one more token to copy."""
    sign, text = ("-", str(example)[1:]) if example < 0 else ("", str(example))
    made = sign + rng.choice("123456789")
    made += "".join(rng.choice(string.digits) if c.isdigit() else c for c in text[1:])
    return float(made) if isinstance(example, float) else int(made)


@functools.cache
def _held(pool_name: str) -> frozenset[Any]:
    return frozenset(pool_part(pool_name, "holdout"))


def _made_up(pool_name: str, rng: random.Random, k: int | None, pieces: Sequence[str] = ()) -> Any:
    held = _held(pool_name)
    train = pool_part(pool_name, "train")

    def one() -> str:
        while True:
            example = rng.choice(train)
            # Wholly made up, or a near miss of a real value (copying must beat a familiar word); with
            # pieces, half of them built from word pieces.
            if pieces and rng.random() < 0.5:
                value = pieces_like(example, rng, pieces)
            elif rng.random() < 0.5:
                value = made_up_like(example, rng)
            else:
                value = near_miss(example, rng)
            if value not in held and value != example:
                return value

    if k is None:
        return one()
    values: list[str] = []
    while len(values) < min(k, len(train)):
        value = one()
        if value not in values:
            values.append(value)
    return values


def draw(pool_name: str, rng: random.Random, part: Values, k: int | None = None) -> Any:
    """One value of `part` of the pool, or a list of `k` distinct ones."""
    pool = POOLS[pool_name]
    if part == "synthetic" or isinstance(part, MadeUp):
        if pool.text:
            return _made_up(pool_name, rng, k, part.pieces if isinstance(part, MadeUp) else ())
        if _numeric(pool) and rng.random() < 0.5:
            made = [_made_up_number(pool_name, rng) for _ in range(k or 1)]
            return made if k is not None else made[0]
        part = "train"
    size = _part_size(pool, part)
    if size == 0:
        raise ValueError(f"pool {pool_name!r} has no {part} values")
    if k is None:
        return pool.value(_part_index(rng.randrange(size), part))
    return [pool.value(_part_index(j, part)) for j in rng.sample(range(size), min(k, size))]


def _made_up_number(pool_name: str, rng: random.Random) -> int | float:
    """A number_like one of a train value, never a held-out value (1144.5 is held out: its digits may
    come up again only in the held-out records)."""
    while True:
        made = number_like(draw(pool_name, rng, "train"), rng)
        if made not in _held(pool_name):
            return made


def _numeric(pool: Pool) -> bool:
    first = pool.value(0)
    return isinstance(first, int | float) and not isinstance(first, bool)
