"""The ``ranker`` policy: MindAct-style candidate ranking over the accessibility tree.

The CPU-scale model path. At each step the prompt (exactly the text the shared prompt builder
writes, mode ``a11y`` or ``both``) is parsed back (:func:`parse_prompt`) into the instruction,
the previous actions, the page's title/URL and its accessibility tree; :func:`candidates` lists
the actions one could take there, in the shared grammar:

* ``click(ref)`` for every clickable element (buttons, links, checkboxes, ``[cursor=pointer]``…),
* ``type(ref, "v")`` for every text field × every value drawn from the instruction (quoted
  strings, the tail after a colon, e-mails, dates, numbers, capitalised name-like spans and their
  words, 3-letter prefixes of capitalised words),
* ``select(ref, "o")`` for every option of every combobox,
* ``answer("t")`` for text spans of the page (cells, ``key: value`` values, prices, numbers) and
  ``answer("done")``; and ``scroll(down)``.

Each candidate has two texts for the frozen MiniLM encoder (:mod:`rollouts.encoder`): the element
(role, name, surrounding text) and the value (typed text, option, answer), embedded separately so
that both repeat across steps and hit the text-hash cache, plus a vector of exact-match features
(:data:`FEATURES`). :class:`RankerModel` scores candidates with an MLP over the instruction,
page and last-action embeddings, the candidate's embeddings, their products, and the features;
the policy takes the top candidate (temperature 0) or samples softmax(scores / T).

The modules, in the order a prompt goes through them:

* :mod:`~rollouts.ranker.prompt`: the prompt parsed back (:class:`RankerInput`);
* :mod:`~rollouts.ranker.tree`: the accessibility tree as nodes, and the element descriptions;
* :mod:`~rollouts.ranker.values`: values drawn from the instruction, answers from the page;
* :mod:`~rollouts.ranker.features`: the exact-match features;
* :mod:`~rollouts.ranker.candidate`: the candidate actions, and a reply's target among them
  (not ``candidates``: that name is the function);
* :mod:`~rollouts.ranker.encoding`: the encoder texts and vectors of a prompt;
* :mod:`~rollouts.ranker.model`: the scorer (:class:`RankerModel`) and its batch tensors;
* :mod:`~rollouts.ranker.policy`: the registered rollout policy (:class:`RankerPolicy`).

Every public name is importable from here. Importing this package registers the policy and does
not import torch: ``RankerModel`` is built on first access (the module ``__getattr__`` below).
"""

from __future__ import annotations

from typing import Any

from rollouts.ranker.candidate import (
    MAX_ANSWERS,
    MAX_CANDIDATES,
    Candidate,
    candidates,
    oracle_coverage,
    same_action,
    target_action,
    target_index,
)
from rollouts.ranker.encoding import (
    Encoded,
    context_texts,
    encode_input,
    encoded,
    encoder_texts,
)
from rollouts.ranker.features import FEATURE_VERSION, FEATURES, N_FEATURES, STOPWORDS, VERBS
from rollouts.ranker.model import (
    MODEL_TYPE,
    batch_tensors,
    ranker_model_class,
    segment_log_softmax,
)
from rollouts.ranker.policy import RankerPolicy
from rollouts.ranker.prompt import NotAWebloopPrompt, RankerInput, parse_prompt, prompt_key
from rollouts.ranker.tree import (
    ANSWER_ROLES,
    CLICKABLE,
    CONTAINERS,
    TEXT_FIELDS,
    Node,
    parse_tree,
)
from rollouts.ranker.values import MAX_VALUES, instruction_values

__all__ = [
    "ANSWER_ROLES",
    "CLICKABLE",
    "CONTAINERS",
    "FEATURES",
    "FEATURE_VERSION",
    "MAX_ANSWERS",
    "MAX_CANDIDATES",
    "MAX_VALUES",
    "MODEL_TYPE",
    "N_FEATURES",
    "STOPWORDS",
    "TEXT_FIELDS",
    "VERBS",
    "Candidate",
    "Encoded",
    "Node",
    "NotAWebloopPrompt",
    "RankerInput",
    "RankerModel",
    "RankerPolicy",
    "batch_tensors",
    "candidates",
    "context_texts",
    "encode_input",
    "encoded",
    "encoder_texts",
    "instruction_values",
    "oracle_coverage",
    "parse_prompt",
    "parse_tree",
    "prompt_key",
    "same_action",
    "segment_log_softmax",
    "target_action",
    "target_index",
]


def __getattr__(name: str) -> Any:
    """``RankerModel`` is built on first access, so importing this package does not import
    torch (1-2 s): the policy registry and the CLI's ``--policy`` check need only the names."""
    if name == "RankerModel":
        return ranker_model_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
