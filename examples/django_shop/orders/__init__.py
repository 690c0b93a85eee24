"""The orders app: a product's stock, the orders placed for it, and the job that confirms each."""
