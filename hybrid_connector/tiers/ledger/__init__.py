"""The ledger: what every tier holds, per kind and page (placement, demotion, promotion, drops reported to the owner); exact accounting, no bytes."""
