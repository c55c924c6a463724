"""Everything up to the JobIR: load -> validate -> check -> lower."""
