"""Who may do what on which queue: API keys, scopes, queue patterns, the key cache."""
