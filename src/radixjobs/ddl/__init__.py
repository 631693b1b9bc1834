"""Job DDL: CREATE / ALTER / DROP JOB text to :mod:`radixjobs.model` statements (pure, no I/O)."""

from radixjobs.ddl.parser import parse_job_statement
from radixjobs.ddl.tokens import Token, TokenKind, is_job_statement, tokenize

__all__ = ["Token", "TokenKind", "is_job_statement", "parse_job_statement", "tokenize"]
