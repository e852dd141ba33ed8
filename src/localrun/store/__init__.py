"""What localrun keeps on disk: its folders, durable-file helpers, and the session store (KV states of named
sessions and the prefix cache, indexed in SQLite with append-only migrations). Standard library only."""
