"""A small part of Lightning 2.6.6 (Apache-2.0), copied with five bugs seeded (NOTICE.md)."""
