"""Between a validated request and the database: the job service, the claim dispatcher, group commit, wake-ups."""
