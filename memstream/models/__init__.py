"""The model providers: chat completions (llm), embeddings (embed), the three roles (roles), local models."""

__all__: list[str] = []
