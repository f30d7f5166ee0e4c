"""The environments' user-error base: a game, data or corpus file that cannot be used, or a
retrieval server that cannot be reached. The message names the file (or URL), what is wrong and
the fix. envs/ imports nothing of sdar_jax, so this is its own base; the commands treat it as a
user error (`sdar_jax.infra.errors.exit_on_user_error(..., extra_types=(EnvInputError,))`)."""


class EnvInputError(ValueError):
  """A bad environment input (file, folder, URL) that the user can fix."""
