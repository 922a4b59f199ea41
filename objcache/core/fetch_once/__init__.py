"""One remote fetch per key (docs/architecture.md, "One remote fetch per node"): in the process
(``singleflight``: concurrent requests for one key share one in-flight task) and on the node
(``nodelease``: cross-process leases in the local tier; ``leased_lookup``: a lookup's local
look and node lease in one worker-thread hop)."""
