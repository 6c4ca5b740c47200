"""`kubectl inspect gpushare`: every shared GPU, who uses it, and what is free."""
