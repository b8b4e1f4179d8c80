"""The kvoffload command line."""
