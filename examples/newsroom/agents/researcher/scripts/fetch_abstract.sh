#!/bin/sh
# Prints the abstract of a paper given its DOI (placeholder for a real lookup).
echo "abstract of $1"
