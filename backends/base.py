X: int = 1
