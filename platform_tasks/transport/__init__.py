"""``platform_tasks.transport:Transport``, the transport string users configure.

The transport lives in :mod:`platform_tasks.brokers.transport`.
"""

from platform_tasks.brokers.transport import Transport as Transport
