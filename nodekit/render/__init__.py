"""Pure functions from specs to documents: compose files, rank environments, image build plans."""
