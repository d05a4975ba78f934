"""Operator endpoints: `/admin/keys`, `/admin/usage`, `/admin/nodes`, and the admin guard they share."""
