"""`single`: one process, no communication. The ideal that scaling efficiency is measured against."""
