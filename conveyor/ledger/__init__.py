"""Money and the platform's records, in Postgres."""
