"""MCPL: transports, links, grants, manifests."""
