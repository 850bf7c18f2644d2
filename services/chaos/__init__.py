"""`tide chaos`: concurrent writers under injected faults, then proof that nothing was lost,
duplicated or left different in any view (docs/reliability.md, "Chaos runner")."""
