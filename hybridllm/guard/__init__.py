"""Guards at the cloud seam: the budget ledger and prices, the privacy scan and its rules, and
`GuardedEngine`, which every cloud request passes (first try, retry, hedge, continuation);
`ledgers.ledger_from_url` picks the ledger a URL names."""
