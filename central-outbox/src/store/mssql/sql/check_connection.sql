SELECT @@TRANCOUNT AS OpenTransactions;
