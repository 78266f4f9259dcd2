"""Query generation: an LM rewrites the request into a search query for any retriever (arXiv 2412.03573)."""
