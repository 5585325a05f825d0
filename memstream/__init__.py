"""memstream: long-term memory for a persona, after the Memory Stream of Generative Agents (Park et al. 2023).

Observe what happens, retrieve by recency + importance + relevance, reflect into insights with evidence.
"""

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from memstream.agent import Agent, format_time
    from memstream.clock import Clock, SystemClock
    from memstream.config import DiscordConfig, ModelConfig, PersonaConfig, StreamConfig, load_persona
    from memstream.errors import (
        BudgetSpent,
        CompletionError,
        ConfigError,
        EmbeddingError,
        MemoryNotFound,
        MemstreamError,
        MigrationError,
        MissingKey,
        MissingVariables,
        PromptError,
        ProviderError,
        SchemaTooNew,
        StoreDamaged,
        StoreError,
        StoreFull,
        StoreLocked,
        StoreReadOnly,
    )
    from memstream.index.ranking import rank
    from memstream.index.reference import rank_reference
    from memstream.index.retriever import Retriever
    from memstream.models.embed import Embedder, OpenAIEmbedder, SentenceTransformerEmbedder
    from memstream.models.llm import ChatModel, Completion, OpenAIChat, StreamingChatModel
    from memstream.models.roles import Models, RoleModel
    from memstream.prompts import Prompt, load_prompt
    from memstream.rate import Rater, Rating, parse_rating
    from memstream.records import (
        Counts,
        EvidenceNode,
        ExplainedReply,
        Memory,
        PendingState,
        ReplyTrace,
        RoleBudget,
        RoleUsage,
        ScoredMemory,
        Source,
        Stats,
        StreamState,
        TraceItem,
    )
    from memstream.reflect import Insight, Reflection, Reflector, parse_citations, parse_insights, parse_questions
    from memstream.replying import Reply, ReplyDraft
    from memstream.store import Store
    from memstream.stream import DEFAULT_STREAM, MemoryStream, Observation

# Loaded on first use (PEP 562): `memstream --help` and the modules that need only a few names do not pay
# for numpy, the openai SDK and SQLite. The names and their modules, as imported above for type checkers.
_SOURCES: dict[str, tuple[str, ...]] = {
    "memstream.agent": ("Agent", "format_time"),
    "memstream.clock": ("Clock", "SystemClock"),
    "memstream.config": ("DiscordConfig", "ModelConfig", "PersonaConfig", "StreamConfig", "load_persona"),
    "memstream.models.embed": ("Embedder", "OpenAIEmbedder", "SentenceTransformerEmbedder"),
    "memstream.errors": ("BudgetSpent", "CompletionError", "ConfigError", "EmbeddingError", "MemoryNotFound",
                         "MemstreamError", "MigrationError", "MissingKey", "MissingVariables", "PromptError",
                         "ProviderError", "SchemaTooNew", "StoreDamaged", "StoreError", "StoreFull", "StoreLocked",
                         "StoreReadOnly"),
    "memstream.models.llm": ("ChatModel", "Completion", "OpenAIChat", "StreamingChatModel"),
    "memstream.models.roles": ("Models", "RoleModel"),
    "memstream.prompts": ("Prompt", "load_prompt"),
    "memstream.rate": ("Rater", "Rating", "parse_rating"),
    "memstream.records": ("Counts", "EvidenceNode", "ExplainedReply", "Memory", "PendingState", "ReplyTrace",
                          "RoleBudget", "RoleUsage", "ScoredMemory", "Source", "Stats", "StreamState", "TraceItem"),
    "memstream.reflect": ("Insight", "Reflection", "Reflector", "parse_citations", "parse_insights",
                          "parse_questions"),
    "memstream.index.ranking": ("rank",),
    "memstream.index.reference": ("rank_reference",),
    "memstream.index.retriever": ("Retriever",),
    "memstream.store": ("Store",),
    "memstream.replying": ("Reply", "ReplyDraft"),
    "memstream.stream": ("DEFAULT_STREAM", "MemoryStream", "Observation"),
}
_OWNER = {name: module for module, names in _SOURCES.items() for name in names}

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_STREAM",
    "Agent",
    "BudgetSpent",
    "ChatModel",
    "Clock",
    "Completion",
    "CompletionError",
    "ConfigError",
    "Counts",
    "DiscordConfig",
    "Embedder",
    "EmbeddingError",
    "EvidenceNode",
    "ExplainedReply",
    "Insight",
    "Memory",
    "MemoryNotFound",
    "MemoryStream",
    "MemstreamError",
    "MigrationError",
    "MissingKey",
    "MissingVariables",
    "ModelConfig",
    "Models",
    "Observation",
    "OpenAIChat",
    "OpenAIEmbedder",
    "PendingState",
    "PersonaConfig",
    "Prompt",
    "PromptError",
    "ProviderError",
    "Rater",
    "Rating",
    "Reflection",
    "Reflector",
    "Reply",
    "ReplyDraft",
    "ReplyTrace",
    "Retriever",
    "RoleBudget",
    "RoleModel",
    "RoleUsage",
    "SchemaTooNew",
    "ScoredMemory",
    "SentenceTransformerEmbedder",
    "Source",
    "Stats",
    "Store",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoreLocked",
    "StoreReadOnly",
    "StreamConfig",
    "StreamState",
    "StreamingChatModel",
    "SystemClock",
    "TraceItem",
    "format_time",
    "load_persona",
    "load_prompt",
    "parse_citations",
    "parse_insights",
    "parse_questions",
    "parse_rating",
    "rank",
    "rank_reference",
]


def __getattr__(name: str) -> _typing.Any:
    module = _OWNER.get(name)
    if module is None:
        raise AttributeError(f"module 'memstream' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
