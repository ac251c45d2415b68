"""What is known: the radix index, the hit rule, saving, reclaim, rebuild and discovery."""
