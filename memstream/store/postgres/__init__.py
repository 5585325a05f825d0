"""The PostgreSQL backend (memstream[postgres]): psycopg 3 with psycopg-pool and pgvector; several processes,
possibly on several machines, share one persona's database."""

from memstream.store.postgres.store import PostgresStore

__all__ = ["PostgresStore"]
