"""Configuration: a persona file (persona.py: StreamConfig, ModelConfig, DiscordConfig, PersonaConfig, validated
once into frozen dataclasses), its daily budget of model calls (budget.py), and where its memory lives and how
that is shown, secrets masked (location.py)."""

from memstream.config.budget import BUDGET_ROLES, BudgetConfig, RoleLimit
from memstream.config.location import MASK, is_database_url, redact, redact_text, show_database, url_problem
from memstream.config.persona import (
    BASELINES,
    PERSONA_MAX_BYTES,
    PROFILE_NAMES,
    STEMMER_LANGUAGES,
    DiscordConfig,
    ModelConfig,
    PersonaConfig,
    StreamConfig,
    check_base_url,
    load_persona,
)

__all__ = ["BASELINES", "BUDGET_ROLES", "MASK", "PERSONA_MAX_BYTES", "PROFILE_NAMES", "STEMMER_LANGUAGES",
           "BudgetConfig", "DiscordConfig", "ModelConfig", "PersonaConfig", "RoleLimit", "StreamConfig",
           "check_base_url", "is_database_url", "load_persona", "redact", "redact_text", "show_database", "url_problem"]
