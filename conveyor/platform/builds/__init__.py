"""Agent and MCP connector builds: the agent.build variants, the builder, and their records."""
