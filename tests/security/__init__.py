"""Security campaign: escape and escalation attempts, each refused or without effect; redaction everywhere."""
