"""The operations console: a Django app over the platform's tables (extra ``django``).

Dead letters (``core.dead_letters``), the operations log (``core.operations``), queue
depths and paused queues, shown in Django's admin with Django's own users, groups and
permissions; bulk replay/discard by filter, cancel and pause/resume run through a
confirmation page that shows the operation's preview, and every one of them is a row
in the operations log. The models are unmanaged: schema ``core`` stays with the
platform's own migrations (``platform-tasks migrate``).

Two ways to run it (docs/console.md):

* ``platform-tasks console``: a bundled settings module
  (:mod:`platform_tasks.contrib.django.settings`) and a WSGI server (waitress), for teams
  without a Django project;
* ``"platform_tasks.contrib.django"`` in an existing project's ``INSTALLED_APPS``, its
  models routed to the platform's database by
  :class:`platform_tasks.contrib.django.routers.PlatformConsoleRouter`.
"""
