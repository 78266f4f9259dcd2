"""toolscout library: data contract, metrics, retrieval methods. Importing it starts nothing."""
