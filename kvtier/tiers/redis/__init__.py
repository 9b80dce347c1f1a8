"""The Redis/Valkey tier: chunks shared by many engines through one store (or a cluster)."""
