"""Libraries edgekit ships inside itself, with the reason and the changes in README.md here."""
