"""The local-disk tier: a verified file per chunk and rank, persistent across restarts."""
