"""The autoresearch loop: task loading, the evaluator and its worker, guards, proposers and the store."""
