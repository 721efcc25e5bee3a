"""The one place where searchjax bridges google-jetstream 0.2.2 to today's environment.

JetStream 0.2.2 (the last PyPI release; upstream is archived) is installed with ``--no-deps`` because its
``seqio`` dependency pulls TensorFlow. Three things then stand between it and current JAX:

1. ``jetstream.engine.token_utils`` imports ``seqio.vocabularies`` at import time, only for its SentencePiece
   tokenizer. searchjax never uses that tokenizer (``SearchJaxEngine.build_tokenizer`` supplies its own), so
   when seqio is absent we register a tiny ``seqio.vocabularies`` module whose two names exist; constructing a
   ``SentencePieceVocabulary`` raises an ImportError that says why.
2. ``jetstream.core.orchestrator.delete_pytree`` calls ``jax.tree_map``, which JAX 0.6 removed. We replace
   that one function in the orchestrator module by the same logic over ``jax.tree.map`` (nothing global in
   ``jax`` is patched).
3. Importing the orchestrator sets the *root* logger to DEBUG and adds a stdout handler, so every decode step
   would be logged to stdout. We undo exactly that change (the handler it added, the level it set).

Import JetStream only through this module: ``engine_api``, ``orchestrator``, ``token_utils``,
``tokenizer_api``, ``tokenizer_pb2``, ``jetstream_pb2``, ``jetstream_pb2_grpc`` are re-exported here.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import types

import jax

_SEQIO_MESSAGE = (
    "JetStream's SentencePiece tokenizer needs seqio (with TensorFlow), which searchjax does not install; "
    "searchjax engines build their own tokenizer (SearchJaxEngine.build_tokenizer)"
)


class _Vocabulary:
    """Stands in for seqio.vocabularies.Vocabulary, which token_utils names only in annotations."""


class _SentencePieceVocabulary(_Vocabulary):
    """Stands in for seqio's SentencePieceVocabulary: constructing it says that seqio is not installed."""

    def __init__(self, *args, **kwargs):
        del args, kwargs
        raise ImportError(_SEQIO_MESSAGE)


def _register_seqio_shim() -> None:
    """Register ``seqio.vocabularies`` when the real seqio is not importable (see the module docstring, 1)."""
    if "seqio" in sys.modules or importlib.util.find_spec("seqio") is not None:
        return
    seqio = types.ModuleType("seqio")
    seqio.__doc__ = "searchjax compatibility shim: " + _SEQIO_MESSAGE
    vocabularies = types.ModuleType("seqio.vocabularies")
    vocabularies.Vocabulary = _Vocabulary
    vocabularies.SentencePieceVocabulary = _SentencePieceVocabulary
    seqio.vocabularies = vocabularies
    sys.modules["seqio"] = seqio
    sys.modules["seqio.vocabularies"] = vocabularies


def _delete_pytree(tree) -> None:
    """The orchestrator's delete_pytree over ``jax.tree.map``: free the device buffers of an inserted prefix."""

    def delete_leaf(leaf):
        if isinstance(leaf, jax.Array):
            leaf.delete()

    jax.tree.map(delete_leaf, tree)


def _import_orchestrator():
    """Import the orchestrator, undoing its root-logger change and replacing delete_pytree (docstring 2, 3)."""
    if "jetstream.core.orchestrator" in sys.modules:
        return sys.modules["jetstream.core.orchestrator"]
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    from jetstream.core import orchestrator as module  # noqa: PLC0415 - the import is what we bridge

    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
    root.setLevel(level)
    module.delete_pytree = _delete_pytree
    return module


_register_seqio_shim()

from jetstream.core.proto import jetstream_pb2, jetstream_pb2_grpc  # noqa: E402
from jetstream.engine import engine_api, token_utils, tokenizer_api, tokenizer_pb2  # noqa: E402

orchestrator = _import_orchestrator()

__all__ = [
    "engine_api",
    "jetstream_pb2",
    "jetstream_pb2_grpc",
    "orchestrator",
    "token_utils",
    "tokenizer_api",
    "tokenizer_pb2",
]
