"""Entry points that turn a config into Ray jobs (Ray Data, Train, Tune, Serve) and the CLI."""
