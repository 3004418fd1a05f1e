"""`aner qualify`: this machine's qualification report, in the reference's schema family."""
