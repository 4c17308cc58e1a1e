"""Discovery: how workers announce themselves and how pools find them."""
