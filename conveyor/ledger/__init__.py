"""Money: the credit ledger, in Postgres (its tables are in conveyor/schema/migrations)."""
