"""The baselines pi2 is measured against: building them and the helpers that keep the comparison fair."""
