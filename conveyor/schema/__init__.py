"""Every table conveyor keeps in Postgres (the ledger's, the broker's queue, the platform's), and the migrator."""
