"""Generative pieces shared by ToolGen, ToolWeaver and the Serve selector: causal LMs, prefix tries."""
